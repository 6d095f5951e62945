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

// The sweep's statements read only what is due, and each statement has
// its index, on a key table that holds what an outage leaves: 100 000
// finished keys and 50 000 unfinished ones in backoff, none due. The
// sweep's reads (the abandoned keys, the count of unknown workflows) must
// reach the due keys through the index of keys that went wrong, so that the
// backlog is not read at each sweep; the watermark and the reap read keys
// by creation time; the per-scope count the primary key, by scope.
func TestSweepStatementsReadOnlyWhatIsDue(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the workers plan the shards' statements")
	db := atomicphasetest.NewDB(t, nil)
	_, err := db.Pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, next_attempt_at)
		SELECT 's' || (i % 500), 'k' || i, 'w', '\x00', 'POST', '/', '{}', now() + interval '1 hour' FROM generate_series(1, 50000) i;
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state,
		                              recovery_point, response_status, finished_at)
		SELECT 'f' || (i % 500), 'k' || i, 'w', '\x00', 'POST', '/', '{}', 'finished', 200, now() FROM generate_series(1, 100000) i;
		ANALYZE idempotency_keys`)
	require.NoError(t, err)
	args := strings.NewReplacer("$1", "'{w}'", "$2", "90000000", "$3", "50", "$4", "5", "$5", "'{}'", "$6", "'{}'")
	statements := map[string]struct {
		sql  string
		want []string
	}{
		"abandoned": {args.Replace(keystore.Render(keystore.AbandonedSQL, "")),
			[]string{"idempotency_keys_waiting_idx", "Index Cond: (next_attempt_at <= now())"}},
		"unknown": {strings.NewReplacer("$1", "'{w}'", "$2", "90000000", "$3", "1000").Replace(keystore.Render(keystore.UnknownSQL, "")),
			[]string{"idempotency_keys_waiting_idx", "Index Cond: (next_attempt_at <= now())"}},
		"reap": {strings.NewReplacer("$1", "86400000000", "$2", "1000").Replace(keystore.Render(keystore.ReapSQL, "")),
			[]string{"idempotency_keys_created_at_idx"}},
		"passed": {strings.NewReplacer("$1", "(now() - interval '1 minute')", "$2", "(now() - interval '1 second')", "$3", "1000").Replace(keystore.Render(keystore.PassedSQL, "")),
			[]string{"idempotency_keys_created_at_idx"}},
		"count": {`SELECT count(*) FROM idempotency_keys WHERE scope = 's1' AND response_status IS NULL AND parked_at IS NULL`,
			[]string{"idempotency_keys_pkey"}},
	}
	for name, st := range statements {
		rows, err := db.Pool.Query(t.Context(), "EXPLAIN "+st.sql)
		require.NoError(t, err, name)
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.NotContains(t, plan.String(), "Seq Scan on idempotency_keys", "%s:\n%s", name, plan.String())
		for _, want := range st.want {
			require.Contains(t, plan.String(), want, "%s:\n%s", name, plan.String())
		}
	}
}
