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
