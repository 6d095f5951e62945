package atomicphase_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The version a recording sets for its statement's INSERT (a
// transaction-local setting the column's default reads) is cleared once the
// recording returns: a key a previous release's function records later on
// the same connection, or in the same transaction, gets no version.
func TestVersionSettingDoesNotLeak(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	admit11 := `SELECT acquired FROM atomicphase_admit('s', $1, 'w', '\x00'::bytea, 'POST', '/', '\x00'::bytea, 1000000, 7, NULL::integer, $2::text)`
	admit10 := `SELECT acquired FROM atomicphase_admit('s', $1, 'w', '\x00'::bytea, 'POST', '/', '\x00'::bytea, 1000000, 7, NULL::integer)`
	var ok bool
	require.NoError(t, conn.QueryRow(b.ctx, admit11, "a", "vX").Scan(&ok))
	require.NoError(t, conn.QueryRow(b.ctx, admit10, "b").Scan(&ok))
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(b.ctx, admit11, "c", "vY").Scan(&ok))
	require.NoError(t, tx.QueryRow(b.ctx, admit10, "d").Scan(&ok))
	require.NoError(t, tx.Commit(b.ctx))
	rows, err := b.db.Pool.Query(b.ctx, `SELECT idempotency_key, coalesce(workflow_version, '<null>') FROM idempotency_keys ORDER BY 1`)
	require.NoError(t, err)
	got := map[string]string{}
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		got[k] = v
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"a": "vX", "b": "<null>", "c": "vY", "d": "<null>"}, got)
}
