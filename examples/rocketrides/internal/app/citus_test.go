package app

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
)

// TestBookingRunsOnOneWorkerOnCitus, in the Citus test mode
// (ATOMICPHASE_TEST_CITUS_URL): the tables are placed as schema.go says, and
// a booking sends every statement of every phase to the worker that holds
// its rider's key, committing each phase there without two-phase commit.
func TestBookingRunsOnOneWorkerOnCitus(t *testing.T) {
	t.Parallel()
	if !atomicphasetest.OnCitus() {
		t.Skip("needs the Citus test mode: set " + atomicphasetest.CitusURLEnv + " (docs/scale.md)")
	}
	type sent struct{ node, sql string }
	var (
		mu   sync.Mutex
		cmds []sent
	)
	onServer := regexp.MustCompile(`on server \S+@(\S+) connectionId`)
	opts := *dbOptions
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			sql, ok := strings.CutPrefix(n.Message, "issuing ")
			if m := onServer.FindStringSubmatch(n.Detail); ok && m != nil {
				mu.Lock()
				cmds = append(cmds, sent{m[1], sql})
				mu.Unlock()
			}
		}
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET citus.log_remote_commands = on")
			return err
		}
	}
	db := atomicphasetest.NewDB(t, &opts)
	ctx := context.Background()

	rows, err := db.Pool.Query(ctx, `SELECT logicalrelid::text || ' ' || CASE
		    WHEN repmodel = 't' THEN 'reference'
		    WHEN partmethod = 'h' AND colocationid = (SELECT colocationid FROM pg_dist_partition
		                                              WHERE logicalrelid = 'idempotency_keys'::regclass)
		    THEN 'by ' || column_to_column_name(logicalrelid, partkey) || ', with the keys'
		    ELSE 'elsewhere' END
		FROM pg_dist_partition ORDER BY 1`)
	require.NoError(t, err)
	placed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"atomicphase_key_history by scope, with the keys", "audit_records by rider, with the keys", "idempotency_keys by scope, with the keys",
		"receipt_outbox by rider, with the keys", "rides by rider, with the keys", "users reference"}, placed)

	payments, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = payments.Close() })
	bank, err := fakebank.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bank.Close() })
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	// No relay: Enqueue only writes the outbox, in the phase's transaction.
	wf := NewWorkflow(payments.URL, bank.URL, &Receipts{})
	var worker string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nodename || ':' || nodeport FROM pg_dist_shard_placement
		WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', 'user@example.com'::text)`).Scan(&worker))
	mu.Lock()
	cmds = nil
	mu.Unlock()

	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "user@example.com", Key: "ride-1",
		Method: "POST", Path: "/rides", Params: []byte(rideBody)})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status, "%s", resp.Body)
	mu.Lock()
	defer mu.Unlock()
	for _, c := range cmds {
		t.Logf("%s: %s", c.node, c.sql)
		require.Equal(t, worker, c.node, "every statement goes to the rider's worker")
		require.NotRegexp(t, `^(PREPARE TRANSACTION|COMMIT PREPARED)`, c.sql, "no two-phase commit")
	}
	for _, table := range []string{"rides", "audit_records", "receipt_outbox"} {
		wrote := false
		for _, c := range cmds {
			wrote = wrote || strings.Contains(c.sql, "public."+table+"_")
		}
		require.True(t, wrote, "the booking wrote %s on the worker", table)
	}
}
