package atomicphase_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A migration marked to run outside a transaction builds its index
// concurrently (which PostgreSQL refuses in a transaction), once; a build
// an earlier run left invalid is dropped and built again.
func TestOnlineMigrationBuildsIndexesConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	m := atomicphase.Migration{Version: 900, Name: "online_test", Up: `-- atomicphase:no-transaction
-- An index for the test.
CREATE INDEX CONCURRENTLY IF NOT EXISTS online_test_idx ON idempotency_keys (created_at);
`}
	applied, err := atomicphase.ApplyMigration(b.ctx, b.db.Pool, "", m)
	require.NoError(t, err)
	require.True(t, applied)
	valid := func() bool {
		var v bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'online_test_idx'::regclass`).Scan(&v))
		return v
	}
	require.True(t, valid())
	applied, err = atomicphase.ApplyMigration(b.ctx, b.db.Pool, "", m)
	require.NoError(t, err)
	require.False(t, applied, "applied once: the ledger has it")

	// An interrupted build leaves the index invalid; the next run of a
	// migration building it drops it and builds it again.
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'online_test_idx'::regclass`); err != nil {
		t.Skipf("cannot mark the index invalid without superuser rights: %v", err)
	}
	m.Version = 901
	applied, err = atomicphase.ApplyMigration(b.ctx, b.db.Pool, "", m)
	require.NoError(t, err)
	require.True(t, applied)
	require.True(t, valid(), "rebuilt")

	// Inside the caller's transaction it cannot run, and says why.
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	m.Version = 902
	_, err = atomicphase.ApplyMigration(b.ctx, tx, "", m)
	require.ErrorContains(t, err, "pass Migrate a *pgxpool.Pool or a *pgx.Conn")
}
