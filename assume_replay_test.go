package atomicphase_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// assumingOpts is base for a pool AssumeNewKeys works on: in the suite's
// exec mode, but pgx's default one in QueryExecModeCacheDescribe, where
// the option does nothing; with tracer, if any, and at most maxConns
// connections (0: the pool's default).
func assumingOpts(base *atomicphasetest.Options, tracer pgx.QueryTracer, maxConns int32) *atomicphasetest.Options {
	opts := *base
	opts.PoolConfig = func(c *pgxpool.Config) {
		if tracer != nil {
			c.ConnConfig.Tracer = tracer
		}
		if maxConns > 0 {
			c.MaxConns = maxConns
		}
		if c.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		}
	}
	return &opts
}

// recordingCapture is a pgx tracer keeping the statements of the last
// batch that records a key at the head of its unit, up to that recording,
// with their arguments.
type recordingCapture struct {
	mu      sync.Mutex
	queries []*pgx.QueuedQuery
}

func (c *recordingCapture) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *recordingCapture) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *recordingCapture) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for i, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "atomicphase_record_first(") {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.queries = d.Batch.QueuedQueries[:i+1]
			break
		}
	}
	return ctx
}
func (c *recordingCapture) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *recordingCapture) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// last returns the statements kept, and forgets them.
func (c *recordingCapture) last() []*pgx.QueuedQuery {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queries
	c.queries = nil
	return q
}

// With AssumeNewKeys, the recording at the head of a replay's batch is
// refused (the key exists) before its transaction takes an id: the
// batch's aborted transaction then writes no WAL and leaves nothing to
// freeze. atomicphase_record_first takes an id first (the sweep's
// watermark needs it before the key's times), so the key's read ahead of
// it ends the batch (keystore's peekAssumedSQL). The test sends the
// replay's own statements again, up to the recording, with their
// arguments, in a savepoint: a subtransaction that took an id makes its
// parent take one.
func TestAssumeNewKeysReplayTakesNoTransactionID(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the option does nothing there, where no transaction commits implicitly (docs/concepts.md, \"Assuming new keys\")")
	capture := &recordingCapture{}
	db := atomicphasetest.NewDB(t, assumingOpts(testDBOpts, capture, 0))
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	ctx := context.Background()
	wf := assumeWorkflow(t, &assumeShop{charges: map[string]int{}}, false)
	for _, key := range []string{"warm-up", "k1"} { // the first learns that migration 019 is applied
		resp, err := runner.Run(ctx, wf, assumeRequest(key, "rocket"))
		require.NoError(t, err)
		require.False(t, resp.Replayed)
	}
	capture.last()
	resp, err := runner.Run(ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	head := capture.last()
	require.NotEmpty(t, head, "the replay's batch recorded the key at its head")

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	_, err = tx.Exec(ctx, "SAVEPOINT head")
	require.NoError(t, err)
	for _, q := range head {
		if _, err = tx.Exec(ctx, q.SQL, q.Arguments...); err != nil {
			break
		}
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "AP003", pgErr.Code, "the key exists")
	_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT head")
	require.NoError(t, err)
	var assigned *int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&assigned))
	require.Nil(t, assigned, "the replay's refused recording took a transaction id")
}

// A replay with AssumeNewKeys is answered from the key's read whoever
// refuses the recording behind it: on a schema without migration 019 the
// claim, which goes alone after the read; and while another session holds
// the claim's lock on the key (a request taking it over), the read's own
// claim (AP002), as the recording's would. Either way the answer is the
// stored response, in one round trip, and nothing of the first unit ran.
func TestAssumeNewKeysReplayIsAnsweredWhateverRefusesItsRecording(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the option does nothing there, where no transaction commits implicitly (docs/concepts.md, \"Assuming new keys\")")
	for _, tc := range []struct {
		name   string
		target int
		held   bool
	}{
		{"claim alone, MinVersion", atomicphase.MinVersion, false},
		{"claim's lock held", 0, true},
		{"claim's lock held, MinVersion", atomicphase.MinVersion, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			counter := &atomicphasetest.RoundTrips{}
			db := atomicphasetest.NewDB(t, assumingOpts(unmigratedDBOpts, counter, 0))
			ctx := context.Background()
			_, err := atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{TargetVersion: tc.target})
			require.NoError(t, err)
			runner, err := atomicphase.NewRunner(db.Pool, nil)
			require.NoError(t, err)
			shop := &assumeShop{charges: map[string]int{}}
			wf := assumeWorkflow(t, shop, false)
			first, err := runner.Run(ctx, wf, assumeRequest("k1", "rocket"))
			require.NoError(t, err)
			if tc.held {
				conn, err := db.Pool.Acquire(ctx)
				require.NoError(t, err)
				defer conn.Release()
				_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('u' || chr(31) || 'k1', 7))`)
				require.NoError(t, err)
				defer conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`) //nolint:errcheck // the connection goes back to the pool
			}
			creates := shop.creates.Load()
			counter.Reset()
			resp, err := runner.Run(ctx, wf, assumeRequest("k1", "rocket"))
			require.NoError(t, err)
			require.True(t, resp.Replayed)
			require.Equal(t, first.Body, resp.Body, "the replay's bytes")
			require.Equal(t, int64(1), counter.Count(), "a replay is one round trip")
			require.Equal(t, creates+1, shop.creates.Load(), "the create phase ran, its write queued")
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key = 'k1'`).Scan(&n))
			require.Equal(t, 2, n, "k1's create and charge rows, once each")
		})
	}
}

// With AssumeNewKeys, on a database whose recording function is gone (a
// pool at an older schema behind a Router, migration 019 rolled back), a
// new key is taken on its own, as without the option, and a replay is
// still answered: pgx's failure to prepare the batch (the function does
// not exist) comes with the key's read, the batch's first result, and is
// the recording's missing function, not the request's failure. Before,
// it failed the first unit, and the key was parked. On a connection that
// prepared the batch's statements before the function went, and on a new
// one.
func TestAssumeNewKeysWithoutTheRecordingsFunctionTakesTheKeyOnItsOwn(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the option does nothing there, where no transaction commits implicitly (docs/concepts.md, \"Assuming new keys\")")
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("newConnection=%t", fresh), func(t *testing.T) {
			t.Parallel()
			db := atomicphasetest.NewDB(t, assumingOpts(testDBOpts, nil, 1))
			ctx := context.Background()
			runner, err := atomicphase.NewRunner(db.Pool, nil)
			require.NoError(t, err)
			wf := assumeWorkflow(t, &assumeShop{charges: map[string]int{}}, false)
			first := map[string][]byte{}
			for _, key := range []string{"warm-up", "k1"} {
				resp, err := runner.Run(ctx, wf, assumeRequest(key, "rocket"))
				require.NoError(t, err)
				first[key] = resp.Body
			}
			_, err = db.Pool.Exec(ctx, `DROP FUNCTION atomicphase_record_first(text, text, text, bytea, text, text,
				bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)`)
			require.NoError(t, err)
			if fresh {
				db.Pool.Reset()
			}
			for _, key := range []string{"k2", "k1", "k3", "k2"} {
				resp, err := runner.Run(ctx, wf, assumeRequest(key, "rocket"))
				require.NoError(t, err, key)
				if first[key] != nil {
					require.True(t, resp.Replayed, key)
					require.Equal(t, first[key], resp.Body, "%s: the replay's bytes", key)
				} else {
					require.False(t, resp.Replayed, key)
					first[key] = resp.Body
				}
			}
			var parked, effects int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE parked_at IS NOT NULL`).Scan(&parked))
			require.Zero(t, parked, "no key parked")
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key IN ('k2', 'k3')`).Scan(&effects))
			require.Equal(t, 4, effects, "k2's and k3's create and charge rows, once each")
		})
	}
}
