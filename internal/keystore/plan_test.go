package keystore_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// A replay is one read of its key, whose lock columns are judged by
// atomicphase_held_until and atomicphase_lock_expires: both must be
// inlined into the statement. A SQL function that is not (one whose body
// has a FROM clause, say) is a function call per replay, which once cost
// replays half their speed against a primary-key read.
func TestReplayReadInlinesItsFunctions(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	// The statement with its parameters written in (scope, key, lock
	// timeout, workflow, fingerprint), as a custom plan would see them.
	sql := strings.NewReplacer("$1", "'s'", "$2", "'k'", "$3", "90000000", "$4", "'w'", "$5", `'\x00'`).
		Replace(keystore.Render(keystore.PeekSQL, ""))
	rows, err := db.Pool.Query(t.Context(), "EXPLAIN (VERBOSE) "+sql)
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		if strings.Contains(line, "Query: ") {
			// On Citus, the statement the coordinator sends the worker,
			// written as the client wrote it; the worker's plan below it
			// is the one that must have the functions inlined.
			continue
		}
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.NotContains(t, plan.String(), "atomicphase_held_until", plan.String())
	require.NotContains(t, plan.String(), "atomicphase_lock_expires", plan.String())
}

// The sweep's statements and the per-scope count of unfinished keys each
// have an index to use (migration 015: one partial index of unfinished keys
// on (scope, next_attempt_at), and created_at for the reap), so that none
// reads the whole key table. On a table this small the planner would
// rather scan it, so sequential scans are turned off, and each statement
// must plan the index meant for it.
func TestSweepStatementsHaveAnIndex(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the workers plan the shards' statements")
	db := atomicphasetest.NewDB(t, nil)
	tx, err := db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	_, err = tx.Exec(t.Context(), "SET LOCAL enable_seqscan = off")
	require.NoError(t, err)
	statements := map[string]struct{ sql, index string }{
		"abandoned": {strings.NewReplacer("$1", "'{w}'", "$2", "90000000", "$3", "100", "$4", "5", "$5", "'{}'", "$6", "'{}'").
			Replace(keystore.Render(keystore.AbandonedSQL, "")), "idempotency_keys_unfinished_idx"},
		"reap": {strings.NewReplacer("$1", "3600000000", "$2", "1000").Replace(keystore.Render(keystore.ReapSQL, "")),
			"idempotency_keys_created_at_idx"},
		"count": {`SELECT count(*) FROM idempotency_keys WHERE scope = 's' AND response_status IS NULL AND parked_at IS NULL`,
			"idempotency_keys_unfinished_idx"},
	}
	for name, st := range statements {
		sql := st.sql
		rows, err := tx.Query(t.Context(), "EXPLAIN "+sql)
		require.NoError(t, err, name)
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.NotContains(t, plan.String(), "Seq Scan on idempotency_keys", "%s:\n%s", name, plan.String())
		require.Contains(t, plan.String(), st.index, "%s:\n%s", name, plan.String())
	}
}
