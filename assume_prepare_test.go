package atomicphase_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// prepareFailures counts the statements a connection failed to prepare
// by name (pgx.PrepareTracer).
type prepareFailures struct{ n atomic.Int64 }

func (p *prepareFailures) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p *prepareFailures) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *prepareFailures) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

func (p *prepareFailures) TracePrepareEnd(_ context.Context, _ *pgx.Conn, data pgx.TracePrepareEndData) {
	if data.Err != nil {
		p.n.Add(1)
	}
}

// A statement that could not be prepared by name for a reason that says
// nothing of its text (here a lock it waited for too long, while a table
// it writes was being altered) is prepared by name again once it can be:
// left to pgx's cache, it would be dropped by every replay's failed batch
// and prepared again by the next new key, a round trip or two more, for
// the pool's life. And a batch tries no more of its statements after
// such a failure: each would wait out the same lock.
func TestAssumeNewKeysPreparesAgainAStatementAfterALockTimedOut(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the option does nothing there, where no transaction commits implicitly (docs/concepts.md, \"Assuming new keys\")")
	failures := &prepareFailures{}
	opts := *testDBOpts
	opts.PoolConfig = func(c *pgxpool.Config) {
		c.MaxConns = 1 // one connection, so statements stay prepared, and the SET below is its
		c.ConnConfig.Tracer = failures
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	}
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	b := &testBundle{db: db, runner: runner, ctx: context.Background()}
	start := func(in assumeInput, req *atomicphase.Request) (assumeState, error) {
		return assumeState{Key: req.Key, Item: in.Item}, nil
	}
	// One unit: its two inserts into effects, the key's read and its
	// recording in one batch.
	wf, err := atomicphase.NewWorkflow("locked", start, []atomicphase.Phase[assumeState]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *assumeState) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', $1, 'create', $2)`, s.Key, s.Item)
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', $1, 'audit', 'created')`, s.Key)
			return atomicphase.Respond(201, []byte("created "+s.Key)), nil
		}),
	}, &atomicphase.WorkflowOpts{AssumeNewKeys: true})
	require.NoError(t, err)
	simple := pgx.QueryExecModeSimpleProtocol
	prepared := func() map[string]string { return preparedStatements(t, b) }
	for _, k := range []string{"k1", "k1", "k2"} {
		_, err := b.runner.Run(b.ctx, wf, assumeRequest(k, "rocket"))
		require.NoError(t, err)
	}
	require.Zero(t, failures.n.Load(), "statements that failed to prepare before the lock")

	// Another session alters the table the unit writes; the runner's one
	// connection waits 50 ms for a lock.
	other, err := pgx.Connect(b.ctx, b.db.URL)
	require.NoError(t, err)
	defer other.Close(b.ctx)
	tx, err := other.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `LOCK TABLE effects IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `SET lock_timeout = '50ms'`, simple)
	require.NoError(t, err)
	// The first batch fails on the lock and deallocates its statements;
	// the next ones prepare them again, and the first of the inserts
	// waits for the lock in its preparation and fails there, and the
	// second is left to the batch.
	for i, k := range []string{"n1", "n2", "n3"} {
		_, err := b.runner.Run(b.ctx, wf, assumeRequest(k, "rocket"))
		require.ErrorContains(t, err, "lock timeout", k)
		require.Equal(t, int64(i), failures.n.Load(), "statements that failed to prepare, after %s", k)
	}
	require.NoError(t, tx.Rollback(b.ctx))
	_, err = b.db.Pool.Exec(b.ctx, `RESET lock_timeout`, simple)
	require.NoError(t, err)

	_, err = b.runner.Run(b.ctx, wf, assumeRequest("n4", "rocket"))
	require.NoError(t, err)
	before := prepared()
	for i := range 3 {
		resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		require.Equal(t, "created k1", string(resp.Body))
		_, err = b.runner.Run(b.ctx, wf, assumeRequest(fmt.Sprintf("new-%d", i), "rocket"))
		require.NoError(t, err)
	}
	require.Equal(t, before, prepared(), "the connection's prepared statements, and when each was prepared")
	require.Equal(t, int64(2), failures.n.Load(), "statements that failed to prepare, after the lock")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key IN ('n1', 'n2', 'n3')`),
		"nothing of a unit that failed on the lock")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects WHERE key = 'n4'`))
}
