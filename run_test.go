package atomicphase_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestRunNewKeyRunsEachPhaseOnceAndReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "key-1"))
	require.NoError(t, err)
	require.False(t, resp.Replayed)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, []int32{1, 1, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()})
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"))

	info, err := b.runner.Inspect(b.ctx, "user_1", "key-1")
	require.NoError(t, err)
	require.Equal(t, atomicphase.RecoveryPointFinished, info.RecoveryPoint)
	require.False(t, info.Locked)

	// Unmarked, a replay's first unit is built ahead of the key's read
	// (Request.Retry): its function runs, its writes never reach the
	// database; marked as a retry, it runs no phase at all.
	for _, retry := range []bool{false, false, true, true} {
		req := orderRequest("user_1", "key-1")
		req.Retry = retry
		before := c.create.Load()
		replay, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		require.Equal(t, resp.Status, replay.Status)
		require.Equal(t, resp.Body, replay.Body, "replayed body must be byte-identical")
		require.Equal(t, resp.Header.Get("Location"), replay.Header.Get("Location"))
		if retry {
			require.Equal(t, before, c.create.Load(), "a replay marked as a retry runs no phase")
		}
	}
	require.Equal(t, []int32{1, 1}, []int32{c.charge.Load(), c.finish.Load()}, "a replay runs no phase past its first unit")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"), "a replay writes nothing")
}

func TestRunSameKeyDifferentParamsIsMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "key-1"))
	require.NoError(t, err)
	before, err := b.runner.Inspect(b.ctx, "user_1", "key-1")
	require.NoError(t, err)

	other := orderRequest("user_1", "key-1")
	other.Params = []byte(`{"item": "rocket", "quantity": 2}`)
	_, err = b.runner.Run(b.ctx, wf, other)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)

	// Reordered members and whitespace are the same request: a replay.
	same := orderRequest("user_1", "key-1")
	same.Params = []byte("{\n  \"quantity\": 1,\n  \"item\": \"rocket\"\n}")
	resp, err := b.runner.Run(b.ctx, wf, same)
	require.NoError(t, err)
	require.True(t, resp.Replayed)

	after, err := b.runner.Inspect(b.ctx, "user_1", "key-1")
	require.NoError(t, err)
	require.Equal(t, before, after, "a mismatch changes nothing")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"), "neither wrote anything")
	_, err = b.runner.Run(b.ctx, wf, asRetry(other))
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	built := int32(3) // the first request's, and each unmarked request's first unit built and dropped
	if unmarkedReadsFirst() {
		built = 1 // every request reads its key first here (unmarkedReadsFirst)
	}
	require.Equal(t, built, c.create.Load(), "a mismatch marked as a retry runs no phase")
}

func TestRunMismatchWhileInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	entered := make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		close(entered)
		<-release
		return nil
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered
	other := orderRequest("u", "k")
	other.Params = []byte(`{"item": "boat", "quantity": 1}`)
	_, err := b.runner.Run(b.ctx, wf, other)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	close(release)
	require.NoError(t, <-done)
}

func TestScopesAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	r1, err := b.runner.Run(b.ctx, wf, orderRequest("alice", "shared-key"))
	require.NoError(t, err)
	r2, err := b.runner.Run(b.ctx, wf, orderRequest("bob", "shared-key"))
	require.NoError(t, err)
	require.False(t, r2.Replayed, "bob's request is new, not alice's replay")
	require.NotEqual(t, r1.Body, r2.Body)
	require.Equal(t, int32(2), c.create.Load())

	// A different body under bob is a mismatch with bob's request only.
	other := orderRequest("carol", "shared-key")
	other.Params = []byte(`{"item": "boat", "quantity": 9}`)
	r3, err := b.runner.Run(b.ctx, wf, other)
	require.NoError(t, err)
	require.False(t, r3.Replayed)
}

// TestRoundTripBudget pins the cost of the hot paths: acquisition and replay
// are one round trip each; a phase costs its own statements (BEGIN rides
// along with the first) plus one for its recovery point and COMMIT.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	counter := &atomicphasetest.RoundTrips{}
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, so statements stay prepared
		cfg.ConnConfig.Tracer = counter
	}
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	ctx := context.Background()

	_, err = runner.Run(ctx, wf, orderRequest("u", "warm-up"))
	require.NoError(t, err)

	counter.Reset()
	_, err = runner.Run(ctx, wf, orderRequest("u", "measured"))
	require.NoError(t, err)
	// read the key 1 · create: BEGIN+record the key+INSERT 1,
	// checkpoint+COMMIT 1 · charge's record step and finish, fused: BEGIN+INSERT 1,
	// checkpoint+COMMIT 1
	require.Equal(t, int64(5), counter.Count(), "round trips for a new key through create → charge → finish")

	counter.Reset()
	resp, err := runner.Run(ctx, wf, orderRequest("u", "measured"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, int64(1), counter.Count(), "a replay is one round trip")

	counter.Reset()
	_, err = runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: "measured", Method: "POST", Path: "/other"})
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.Equal(t, int64(1), counter.Count(), "a mismatch is one round trip")
}

// With writes queued (Tx.Queue), a phase costs no round trip of its own:
// its writes travel with its commit.
func TestRoundTripBudgetWithQueuedWrites(t *testing.T) {
	t.Parallel()
	counter := &atomicphasetest.RoundTrips{}
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.Tracer = counter
	}
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	type st struct {
		ChargeID string `json:"charge_id"`
	}
	wf := atomicphase.MustWorkflow("queued", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'create')`)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				s.ChargeID = "ch_" + key
				return nil
			})
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', 'charge', $1)`, s.ChargeID)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("finish", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'outbox')`)
			return atomicphase.Respond(201, []byte(s.ChargeID)), nil
		}),
	}, nil)
	ctx := context.Background()
	req := func(key string) atomicphase.Request {
		return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/q"}
	}
	_, err = runner.Run(ctx, wf, req("warm-up"))
	require.NoError(t, err)

	counter.Reset()
	_, err = runner.Run(ctx, wf, req("measured"))
	require.NoError(t, err)
	// the key's read+record+INSERT+checkpoint 1 · the call · INSERT+INSERT+
	// the checkpoint that finishes 1: what hand-written code sends
	newKey := int64(2)
	if unmarkedReadsFirst() {
		newKey = 3 // the key's read first, here (unmarkedReadsFirst)
	}
	require.Equal(t, newKey, counter.Count(), "round trips for a new key, writes queued")
	counter.Reset()
	_, err = runner.Run(ctx, wf, req("measured"))
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.Count(), "a replay is one round trip")
	counter.Reset()
	_, err = runner.Run(ctx, wf, asRetry(req("measured")))
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.Count(), "a replay marked as a retry is one round trip")
	counter.Reset()
	_, err = runner.Run(ctx, wf, asRetry(req("new, marked")))
	require.NoError(t, err)
	require.Equal(t, int64(3), counter.Count(), "a new key marked as a retry reads it first")
	b := &testBundle{db: db, runner: runner, ctx: ctx}
	require.Equal(t, 9, b.count(t, `SELECT count(*) FROM effects`), "three writes per new key, all committed, none by a replay")
}
