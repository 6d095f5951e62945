package atomicphase_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
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

	for range 3 {
		replay, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "key-1"))
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		require.Equal(t, resp.Status, replay.Status)
		require.Equal(t, resp.Body, replay.Body, "replayed body must be byte-identical")
		require.Equal(t, resp.Header.Get("Location"), replay.Header.Get("Location"))
	}
	require.Equal(t, []int32{1, 1, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()}, "a replay runs no phase")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"))
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
	require.Equal(t, int32(1), c.create.Load())
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

func TestRunConcurrentDuplicatesRunPhasesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})

	const n = 50
	var (
		wg                         sync.WaitGroup
		mu                         sync.Mutex
		fresh, replays, inProgress int
		bodies                     = map[string]bool{}
		start                      = make(chan struct{})
		unexpected                 []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "same-key"))
			mu.Lock()
			defer mu.Unlock()
			var ip *atomicphase.InProgressError
			switch {
			case errors.As(err, &ip):
				require.Positive(t, ip.RetryAfter)
				inProgress++
			case err != nil:
				unexpected = append(unexpected, err)
			case resp.Replayed:
				replays++
				bodies[string(resp.Body)] = true
			default:
				fresh++
				bodies[string(resp.Body)] = true
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, unexpected)
	require.Equal(t, 1, fresh, "exactly one attempt runs the phases")
	require.Equal(t, n, fresh+replays+inProgress)
	require.Len(t, bodies, 1, "every answer carries the same body")
	require.Equal(t, []int32{1, 1, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()})
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"))
}

func TestRunDuplicateAnsweredAtOnceDuringSlowForeignCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	entered := make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			close(entered)
			<-release // a slow downstream
			s.ChargeID = "ch_slow"
			return nil
		})
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered

	// The holder is inside its foreign call: it must hold no row lock, no
	// transaction and no connection, so the duplicate is answered at once.
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	_, err := b.runner.Run(ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	require.Zero(t, b.count(t, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`), "no transaction is open during the foreign call")
	require.Zero(t, b.db.Pool.Stat().AcquiredConns()-0, "no pooled connection is held during the foreign call")

	close(release)
	require.NoError(t, <-done)
}

func TestRunPhaseErrorResumesAtFailedPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	failCharge := true
	var seenOrderID int64
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		seenOrderID = s.OrderID
		if failCharge {
			return errors.New("payment API unreachable")
		}
		return call.Do(ctx, func(ctx context.Context, key string) error { s.ChargeID = "ch_1"; return nil })
	}})

	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "charge", pe.Phase)
	require.ErrorContains(t, err, "payment API unreachable")

	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint, "phase 1 committed with its recovery point")
	require.False(t, info.Locked, "a phase error unlocks the key")
	require.Nil(t, info.Response, "nothing is stored for a transient failure")
	firstOrderID := seenOrderID
	require.NotZero(t, firstOrderID)

	failCharge = false
	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, int32(1), c.create.Load(), "phase 1 is not run again")
	require.Equal(t, int32(2), c.charge.Load())
	require.Equal(t, firstOrderID, seenOrderID, "phase 2 sees the state phase 1 committed")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'create'"))
}

func TestRunPhaseErrorRollsBackItsWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{afterCreate: func(ctx context.Context, tx pgx.Tx) error {
		return errors.New("boom after insert")
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorContains(t, err, "boom after insert")
	require.Zero(t, b.count(t, "SELECT count(*) FROM effects"), "the phase's writes rolled back")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.RecoveryPointStarted, info.RecoveryPoint)
}

func TestRunPanicUnlocksAndRepanics(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{afterCreate: func(ctx context.Context, tx pgx.Tx) error {
		panic("phase bug")
	}})
	require.PanicsWithValue(t, "phase bug", func() {
		_, _ = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	})
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.False(t, info.Locked, "the key is unlocked before the panic goes on")
	require.Equal(t, atomicphase.RecoveryPointStarted, info.RecoveryPoint)
	require.Zero(t, b.count(t, "SELECT count(*) FROM effects"))
}

func TestRunFencingStopsSlowAttemptAfterTakeover(t *testing.T) {
	t.Parallel()
	const lockTimeout = 300 * time.Millisecond
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout})
	var c counters
	blockA := make(chan struct{})
	inFinish := make(chan struct{}, 1)
	var attemptsInFinish int32
	var mu sync.Mutex
	wf := orderWorkflow(t, &c, hooks{finish: func(ctx context.Context, tx pgx.Tx, s *orderState) error {
		mu.Lock()
		attemptsInFinish++
		first := attemptsInFinish == 1
		mu.Unlock()
		if first {
			// A writes, then stalls past the lock timeout.
			if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('', '', 'finish-a', 'A')`); err != nil {
				return err
			}
			inFinish <- struct{}{}
			<-blockA
		}
		return nil
	}})

	aDone := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		aDone <- err
	}()
	<-inFinish
	time.Sleep(lockTimeout + 100*time.Millisecond)

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err, "B takes the stale key over and finishes")
	require.Equal(t, 201, resp.Status)

	close(blockA)
	err = <-aDone
	require.ErrorIs(t, err, atomicphase.ErrLockLost)
	require.Zero(t, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'finish-a'"), "none of A's writes remain")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'finish'"))

	replay, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.Equal(t, resp.Body, replay.Body)
}

func TestRunRetriesSerializationFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{RetryBackoff: time.Millisecond})
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('', '', 'counter', '0')`)
	require.NoError(t, err)

	var attempts int
	wf, err := atomicphase.NewWorkflow("bump", []atomicphase.Phase[struct{}]{
		atomicphase.Local("bump", func(ctx context.Context, tx pgx.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			attempts++
			var note string
			if err := tx.QueryRow(ctx, `SELECT note FROM effects WHERE phase = 'counter'`).Scan(&note); err != nil {
				return atomicphase.Outcome{}, err
			}
			if attempts == 1 {
				// A concurrent writer commits after our snapshot was taken.
				if _, err := b.db.Pool.Exec(ctx, `UPDATE effects SET note = 'x' || note WHERE phase = 'counter'`); err != nil {
					return atomicphase.Outcome{}, err
				}
			}
			_, err := tx.Exec(ctx, `UPDATE effects SET note = note || '+' WHERE phase = 'counter'`)
			return atomicphase.Respond(200, []byte(`{}`)), err
		}).WithIsolation(pgx.RepeatableRead),
	}, nil)
	require.NoError(t, err)

	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/bump"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
	require.Equal(t, 2, attempts, "the serialization failure was retried once")
	var note string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT note FROM effects WHERE phase = 'counter'`).Scan(&note))
	require.Equal(t, "x0+", note)
}

func TestRunRetriesDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{RetryBackoff: time.Millisecond})
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO effects (scope, key, phase) VALUES ('', '', 'r1'), ('', '', 'r2')`)
	require.NoError(t, err)

	// Two workflows lock r1 and r2 in opposite orders; a barrier makes each
	// hold its first lock before asking for the second, so PostgreSQL must
	// break a deadlock. The victim's phase is retried and both finish.
	barrier := make(chan struct{}, 2)
	var once sync.Map
	mk := func(name, first, second string) *atomicphase.Workflow[struct{}] {
		wf, err := atomicphase.NewWorkflow(name, []atomicphase.Phase[struct{}]{
			atomicphase.Local("lock", func(ctx context.Context, tx pgx.Tx, _ *struct{}) (atomicphase.Outcome, error) {
				if _, err := tx.Exec(ctx, `UPDATE effects SET note = $1 WHERE phase = $2`, name, first); err != nil {
					return atomicphase.Outcome{}, err
				}
				if _, loaded := once.LoadOrStore(name, true); !loaded {
					barrier <- struct{}{}
					for len(barrier) < 2 {
						time.Sleep(5 * time.Millisecond)
					}
				}
				_, err := tx.Exec(ctx, `UPDATE effects SET note = $1 WHERE phase = $2`, name, second)
				return atomicphase.Respond(200, []byte(name)), err
			}),
		}, nil)
		require.NoError(t, err)
		return wf
	}
	wfA, wfB := mk("a", "r1", "r2"), mk("b", "r2", "r1")
	errs := make(chan error, 2)
	for _, wf := range []*atomicphase.Workflow[struct{}]{wfA, wfB} {
		go func() {
			_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: wf.Name(), Method: "POST", Path: "/x"})
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

func TestDownstreamKeyStableAndScoped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	var mu sync.Mutex
	var keys []string
	fail := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			keys = append(keys, key)
			if fail && s.Item == "rocket" && len(keys) == 1 {
				return errors.New("timeout after the downstream charged")
			}
			return nil
		})
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "k"))
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("user_1", "k"))
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("user_2", "k"))
	require.NoError(t, err)

	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1], "the retry repeats the call with the same downstream key")
	require.NotEqual(t, keys[0], keys[2], "another scope gets another downstream key")
	require.Equal(t, atomicphase.DownstreamKey("order", "user_1", "k", "charge"), keys[0])
	require.NotEqual(t, atomicphase.DownstreamKey("order", "user_1", "k", "charge"),
		atomicphase.DownstreamKey("order", "user_1", "k", "refund"), "phases get distinct keys")
}

func TestSecondForeignCallFailsThePhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	var calls int
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		do := func(ctx context.Context, key string) error { calls++; return nil }
		_ = call.Do(ctx, do)
		_ = call.Do(ctx, do) // swallowed error: the phase must fail anyway
		return nil
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrSecondForeignCall)
	require.Equal(t, 1, calls, "the second call never ran")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint)
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

func TestRunStoreUnavailableRunsNothing(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	runner, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)

	var c counters
	foreign := 0
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		foreign++
		return nil
	}})
	_, err = runner.Run(context.Background(), wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.Zero(t, c.create.Load()+c.charge.Load()+c.finish.Load())
	require.Zero(t, foreign)
}

func TestRunRejectsInvalidKeysBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	for _, key := range []string{"", strings.Repeat("k", 256), "tab\there", "nul\x00", "é-non-ascii", "del\x7f"} {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", key))
		require.ErrorIs(t, err, atomicphase.ErrInvalidKey, "key %q", key)
	}
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", strings.Repeat("k", 255)))
	require.NoError(t, err, "255 characters is the limit, inclusive")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM idempotency_keys"))
	require.Equal(t, int32(1), c.create.Load())
}

func TestRunInvalidParamsStoreNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	req := orderRequest("u", "k")
	req.Params = []byte(`{"item": `)
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	req.Params = []byte(`{"item": "rocket", "quantity": "many"}`) // Start cannot decode it
	_, err = b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))

	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err, "a corrected request may use the key")
}
