package atomicphase_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

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

	// A runs in a process that cannot renew its lease while it stalls (its
	// one connection is the one its phase holds), as a frozen process
	// cannot: the lease ends, and B may take the key over.
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 1
	poolA, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(poolA.Close)
	runnerA, err := atomicphase.NewRunner(poolA, &atomicphase.Config{LockTimeout: lockTimeout})
	require.NoError(t, err)
	aDone := make(chan error, 1)
	go func() {
		_, err := runnerA.Run(b.ctx, wf, orderRequest("u", "k"))
		aDone <- err
	}()
	t.Cleanup(func() {
		select {
		case <-blockA:
		default:
			close(blockA) // a failed test does not leave A blocked
		}
	})
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
	wf, err := atomicphase.NewWorkflow("bump", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("bump", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			attempts++
			var note string
			if err := tx.QueryRow(ctx, `SELECT note FROM effects WHERE scope = '' AND phase = 'counter'`).Scan(&note); err != nil {
				return atomicphase.Outcome{}, err
			}
			if attempts == 1 {
				// A concurrent writer commits after our snapshot was taken.
				if _, err := b.db.Pool.Exec(ctx, `UPDATE effects SET note = 'x' || note WHERE scope = '' AND phase = 'counter'`); err != nil {
					return atomicphase.Outcome{}, err
				}
			}
			_, err := tx.Exec(ctx, `UPDATE effects SET note = note || '+' WHERE scope = '' AND phase = 'counter'`)
			return atomicphase.Respond(200, []byte(`{}`)), err
		}).WithIsolation(pgx.RepeatableRead),
	}, nil)
	require.NoError(t, err)

	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/bump"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
	require.Equal(t, 2, attempts, "the serialization failure was retried once")
	var note string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT note FROM effects WHERE scope = '' AND phase = 'counter'`).Scan(&note))
	require.Equal(t, "x0+", note)
}

func TestRunRetriesDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{RetryBackoff: time.Millisecond})
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO effects (scope, key, phase) VALUES ('', '', 'r1'), ('', '', 'r2')`)
	require.NoError(t, err)

	// Two workflows lock r1 and r2 in opposite orders; a barrier makes each
	// hold its first lock before asking for the second, so PostgreSQL must
	// break a deadlock. The victim's phase is retried and both finish. The
	// updates are keyed by scope: on Citus one that is not goes to every
	// shard, and the second waits for the first's whole transaction on the
	// coordinator (which serialises multi-shard writes) instead of
	// deadlocking, while the first waits at the barrier.
	barrier := make(chan struct{}, 2)
	var once sync.Map
	mk := func(name, first, second string) *atomicphase.Workflow[struct{}] {
		wf, err := atomicphase.NewWorkflow(name, startEmpty[struct{}], []atomicphase.Phase[struct{}]{
			atomicphase.Local("lock", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
				if _, err := tx.Exec(ctx, `UPDATE effects SET note = $1 WHERE scope = '' AND phase = $2`, name, first); err != nil {
					return atomicphase.Outcome{}, err
				}
				if _, loaded := once.LoadOrStore(name, true); !loaded {
					barrier <- struct{}{}
					for len(barrier) < 2 {
						time.Sleep(5 * time.Millisecond)
					}
				}
				_, err := tx.Exec(ctx, `UPDATE effects SET note = $1 WHERE scope = '' AND phase = $2`, name, second)
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

func TestWorkflowEndingWithoutResponseFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf, err := atomicphase.NewWorkflow("silent", startEmpty[struct{}], []atomicphase.Phase[struct{}]{atomicphase.Local("only", noop)}, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorIs(t, err, atomicphase.ErrNoResponse)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.RecoveryPointStarted, info.RecoveryPoint, "the phase rolled back")
}

// parked reads a key's parked mark and last error.
func parked(t *testing.T, b *testBundle, scope, key string) (bool, string) {
	t.Helper()
	info, err := b.runner.Inspect(b.ctx, scope, key)
	require.NoError(t, err)
	if info.ParkedAt == nil {
		return false, ""
	}
	require.NotNil(t, info.LastError)
	require.False(t, info.Locked, "a parked key is unlocked")
	return true, *info.LastError
}

// An error a phase marks Permanent parks the key and is final for the
// client: a retry gets the parked key's answer and runs nothing, until an
// operator unparks the key (the code fixed); the next retry resumes it.
func TestPermanentErrorParksTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var broken atomic.Bool
	broken.Store(true)
	var calls atomic.Int32
	type st struct{}
	wf := atomicphase.MustWorkflow("perm", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("check", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			calls.Add(1)
			if broken.Load() {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("downstream says 400: unknown account"))
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.False(t, atomicphase.Retryable(err), "a client must not loop on it")
	isParked, why := parked(t, b, "u", "k")
	require.True(t, isParked)
	require.Contains(t, why, "unknown account")

	broken.Store(false)
	for range 5 {
		_, err = b.runner.Run(b.ctx, wf, asRetry(req))
		require.ErrorIs(t, err, atomicphase.ErrParked)
		require.ErrorIs(t, err, atomicphase.ErrPermanent)
		require.False(t, atomicphase.Retryable(err))
	}
	require.EqualValues(t, 1, calls.Load(), "a parked key's retry runs nothing")
	require.NoError(t, b.runner.Unpark(b.ctx, "u", "k"))
	resp, err := b.runner.Run(b.ctx, wf, asRetry(req))
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
	require.EqualValues(t, 2, calls.Load())
	isParked, _ = parked(t, b, "u", "k")
	require.False(t, isParked)
}

// The framework's own programming errors are permanent: a retry would
// meet them again.
func TestProgrammingErrorsArePermanent(t *testing.T) {
	t.Parallel()
	type st struct{}
	for name, phase := range map[string]atomicphase.Phase[st]{
		"no response": atomicphase.Local("last", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		"second foreign call": atomicphase.Foreign("call", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			_ = call.Do(ctx, func(context.Context, string) error { return nil })
			_ = call.Do(ctx, func(context.Context, string) error { return nil })
			return nil
		}, nil),
		"informational status": atomicphase.Local("early", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(103, nil), nil
		}),
		"undeclared jump": atomicphase.Local("jump", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.JumpTo("nowhere"), nil
		}),
		"misspelt column": atomicphase.Local("insert", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects (scoop) VALUES ('u')`)
			return atomicphase.Continue(), err
		}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			wf := atomicphase.MustWorkflow("prog", startEmpty[st], []atomicphase.Phase[st]{phase}, nil)
			_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"})
			require.ErrorIs(t, err, atomicphase.ErrPermanent)
			require.False(t, atomicphase.Retryable(err))
			isParked, _ := parked(t, b, "u", "k")
			require.True(t, isParked)
		})
	}
}

// A row that breaks a constraint breaks it on every retry, and a value the
// database refuses is refused every time: the request's own data is at
// fault, so its final answer is a 422, stored and replayed, and nothing is
// parked (before, the key was parked and the client got a 500).
func TestConstraintViolationIsTheRequestsAnswer(t *testing.T) {
	t.Parallel()
	type st struct{}
	for name, sql := range map[string]string{
		"check":            `INSERT INTO qty VALUES (0)`,
		"not null":         `INSERT INTO qty VALUES (NULL)`,
		"unique":           `INSERT INTO qty VALUES (1), (1)`,
		"division by zero": `SELECT 1 / (SELECT count(*) FROM qty)::int`,
		"out of range":     `INSERT INTO qty VALUES (2147483647 + 1)`,
		"bad text":         `SELECT 'x'::int`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE qty (n int NOT NULL CHECK (n > 0) UNIQUE)`)
			require.NoError(t, err)
			runs := 0
			wf := atomicphase.MustWorkflow("chk", startEmpty[st], []atomicphase.Phase[st]{
				atomicphase.Local("ins", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
					runs++
					_, err := tx.Exec(ctx, sql)
					return atomicphase.Respond(200, nil), err
				}),
			}, nil)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
			resp, err := b.runner.Run(b.ctx, wf, req)
			require.NoError(t, err)
			require.Equal(t, 422, resp.Status)
			again, err := b.runner.Run(b.ctx, wf, asRetry(req))
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, resp.Body, again.Body)
			require.Equal(t, 1, runs)
			isParked, _ := parked(t, b, "u", "k")
			require.False(t, isParked, "a client's mistake parks nothing")
		})
	}
}

// A panic every retry would meet parks the key, with the panic, and goes on.
func TestPanicParksTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	wf := atomicphase.MustWorkflow("pan", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("boom", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			var m map[string]int
			m["x"] = 1
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"}
	require.Panics(t, func() { _, _ = b.runner.Run(b.ctx, wf, req) })
	isParked, why := parked(t, b, "u", "k")
	require.Contains(t, why, "assignment to entry in nil map")
	require.True(t, isParked, "a panic that every retry meets is not parked")
}

// An attempt whose context is cancelled (the client hung up, the process is
// shutting down) and whose key has meanwhile moved on still says it was
// cancelled: the caller that cancelled it finds context.Canceled in the
// error, and ErrLockLost with it.
func TestCancelledAttemptThatLostTheKeySaysItWasCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	wf := orderWorkflow(t, &c, hooks{finish: func(context.Context, pgx.Tx, *orderState) error {
		// Another attempt takes the key over (its token moves on) while
		// this one is being cancelled.
		if _, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET lock_token = lock_token + 1 WHERE idempotency_key = 'k'`); err != nil {
			return err
		}
		cancel()
		return ctx.Err()
	}})
	_, err := b.runner.Run(ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrLockLost)
	require.ErrorIs(t, err, context.Canceled, "the caller sees its own cancellation")
	require.True(t, atomicphase.Retryable(err))
}
