package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

type revIn struct {
	Name string `json:"name"`
}
type revSt struct {
	Name string `json:"name"`
}

func revStart(in revIn, _ *atomicphase.Request) (revSt, error) { return revSt{Name: in.Name}, nil }

func revReq(key string) atomicphase.Request {
	return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/r", Params: []byte(`{"name":"` + key + `"}`)}
}

// R1: the sweep selects its batch once, then resumes each key through a
// take that does not re-check parked_at / next_attempt_at. A key parked
// (by a client's permanent failure) while the sweep works on an earlier key
// of its batch is run again by the sweep, and unparked by it.
func TestSweepTakesOnlyKeysStillDue(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Millisecond, MaxAttemptBackoff: time.Millisecond})
	var failAll atomic.Bool
	failAll.Store(true)
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	var k2runs atomic.Int32
	var sweeping atomic.Bool
	wf := atomicphase.MustWorkflow("rev", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(ctx context.Context, tx atomicphase.Tx, s *revSt) (atomicphase.Outcome, error) {
			if failAll.Load() {
				return atomicphase.Outcome{}, errors.New("transient")
			}
			switch s.Name {
			case "k1":
				if sweeping.Load() {
					entered <- struct{}{}
					<-block
				}
				return atomicphase.Respond(200, nil), nil
			default:
				k2runs.Add(1)
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("card number invalid"))
			}
		}),
	}, nil)
	for _, k := range []string{"k1", "k2"} {
		_, err := b.runner.Run(b.ctx, wf, revReq(k))
		require.Error(t, err)
		time.Sleep(5 * time.Millisecond) // k1 older updated_at than k2
	}
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET next_attempt_at = created_at WHERE next_attempt_at IS NOT NULL`)
	require.NoError(t, err)
	failAll.Store(false)
	sweeping.Store(true)

	// One worker: the sweep resumes k1, then k2, as the scenario needs.
	s := newSweeper(t, b, &atomicphase.SweepConfig{Workers: 1})
	var closeBlock sync.Once
	defer closeBlock.Do(func() { close(block) }) // never leave the sweep blocked, whatever fails
	done := make(chan atomicphase.SweepResult)
	go func() {
		res, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		done <- res
	}()
	<-entered // the sweep read [k1, k2] and is inside k1
	_, err = b.runner.Run(b.ctx, wf, asRetry(revReq("k2")))
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	info, err := b.runner.Inspect(b.ctx, "u", "k2")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.EqualValues(t, 1, k2runs.Load())
	closeBlock.Do(func() { close(block) })
	res := <-done
	t.Logf("sweep result %+v; k2 phase runs %d", res, k2runs.Load())
	require.EqualValues(t, 1, k2runs.Load(), "the sweep ran a key that was parked by the time it took it")
}

// R2: a phase that panics while the sweep resumes its key takes the panic
// out of RunOnce (and so out of Sweeper.Run's goroutine: the process dies).
func TestSweepSurvivesAPanickingPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{FaultInjector: crashOnce("boom", atomicphase.BeforePhase)})
	wf := atomicphase.MustWorkflow("pan", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("boom", func(ctx context.Context, tx atomicphase.Tx, _ *revSt) (atomicphase.Outcome, error) {
			var m map[string]int
			m["x"] = 1
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, revReq("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	s := newSweeper(t, b, nil)
	var res atomicphase.SweepResult
	require.NotPanics(t, func() { res, _ = s.RunOnce(b.ctx) }, "one bad key should not take the sweeper (and the process) down")
	t.Logf("%+v", res)
}

// R3: a key whose attempts die without failing (process killed: OOM, a
// phase that os.Exits, a deploy) is taken over again and again by the
// sweep; attempts grow past MaxAttempts and it is never parked.
func TestSweepParksAKeyWhoseAttemptsNeverFinish(t *testing.T) {
	t.Parallel()
	crash := atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
		if at.Phase == "p" && at.Place == atomicphase.BeforePhase {
			return fmt.Errorf("OOM-killed: %w", atomicphase.ErrCrashed)
		}
		return nil
	})
	b := setup(t, &atomicphase.Config{MaxAttempts: 3, FaultInjector: crash})
	// Each phase commits on its own, so the key is recorded before the
	// phase dies.
	wf := atomicphase.MustWorkflow("crashy", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	_, err := b.runner.Run(b.ctx, wf, revReq("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	s := newSweeper(t, b, nil)
	for range 8 {
		ageLocks(t, b)
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status, "MaxAttempts 3, yet the sweep keeps taking it")
	require.Equal(t, 4, info.Attempts, "three attempts that never finished, and the take that parked it")
	require.Contains(t, *info.LastError, "3 attempts never finished")
}

// R4: an attempt that lost its lock (slower than LockTimeout) and then
// fails permanently reports the key parked (PhaseError.Parked, key.parked)
// although its release matched no row: the key was finished by the newer
// attempt.
func TestFailureAfterALostLockParksNothing(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec})
	var n atomic.Int32
	inCall := make(chan struct{})
	release := make(chan struct{})
	wf := atomicphase.MustWorkflow("slow", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *revSt) error {
			if n.Add(1) == 1 {
				close(inCall)
				<-release
				return atomicphase.Permanent(errors.New("declined"))
			}
			return nil
		}, func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("ok")), nil
		}),
	}, nil)
	errc := make(chan error)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, revReq("k"))
		errc <- err
	}()
	<-inCall
	ageLocks(t, b)
	resp, err := b.runner.Run(b.ctx, wf, revReq("k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	close(release)
	err = <-errc
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	info, ierr := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, ierr)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	parkedEvents := 0
	for _, k := range rec.take() {
		if k == atomicphase.EventParked {
			parkedEvents++
		}
	}
	t.Logf("PhaseError.Parked=%v, key.parked events=%d, status=%s, Retryable(err)=%v, err=%v", pe.Parked, parkedEvents, info.Status, atomicphase.Retryable(err), err)
	require.False(t, pe.Parked, "the key is finished, not parked")
	require.Zero(t, parkedEvents)
}

// R5: Unpark leaves attempts at MaxAttempts, so an unparked key gets one
// try and is parked again at once, with no backoff in between (the CLI's
// resume help promises "retried with backoff and parked again after
// Config.MaxAttempts attempts").
func TestUnparkGivesAFreshBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 3, AttemptBackoff: time.Millisecond})
	var calls atomic.Int32
	wf := atomicphase.MustWorkflow("flaky", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			calls.Add(1)
			return atomicphase.Outcome{}, errors.New("dependency down")
		}),
	}, nil)
	for range 3 {
		_, _ = b.runner.Run(b.ctx, wf, revReq("k"))
	}
	info, _ := b.runner.Inspect(b.ctx, "u", "k")
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.NoError(t, b.runner.Unpark(b.ctx, "u", "k"))
	s := newSweeper(t, b, nil)
	_, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	info, _ = b.runner.Inspect(b.ctx, "u", "k")
	t.Logf("after unpark + one sweep: status %s attempts %d last_error %q", info.Status, info.Attempts, *info.LastError)
	require.NotEqual(t, atomicphase.KeyParked, info.Status, "parked again after a single try")
}

// R6: a backoff left by an earlier failure keeps the sweep off a key whose
// later attempt (a client retry) died holding the lock: a crash is not
// completed within LockTimeout + a few sweep intervals.
func TestTakingAKeyClearsItsBackoff(t *testing.T) {
	t.Parallel()
	var fail, crashNow atomic.Bool
	fi := atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
		if at.Phase == "p" && at.Place == atomicphase.BeforePhase && crashNow.CompareAndSwap(true, false) {
			return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
		}
		return nil
	})
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Hour, FaultInjector: fi})
	fail.Store(true)
	wf := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			if fail.Load() {
				return atomicphase.Outcome{}, errors.New("blip")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, revReq("k")) // fails: backoff ~1h
	require.Error(t, err)
	fail.Store(false)
	crashNow.Store(true)
	_, err = b.runner.Run(b.ctx, wf, asRetry(revReq("k"))) // the client retries; the process dies
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	res, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed, "a stale key is completed by the sweep, whatever an earlier failure's backoff said")
}

// R7: a panicking phase gets no phase.failed event (its span ends, the key
// is parked, but the phase's failure is never counted).
func TestPanickingPhaseIsObservedAsFailed(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec})
	wf := atomicphase.MustWorkflow("pan", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("boom", func(ctx context.Context, tx atomicphase.Tx, _ *revSt) (atomicphase.Outcome, error) {
			panic("bug")
		}),
	}, nil)
	require.Panics(t, func() { _, _ = b.runner.Run(b.ctx, wf, revReq("k")) })
	kinds := rec.take()
	t.Logf("%v", kinds)
	require.Contains(t, kinds, atomicphase.EventPhaseFailed)
}

// R8: a phase that hangs (a foreign call without a deadline) holds the
// sweep: RunOnce never moves on to the rest of its batch. After LockTimeout
// the key is stale, the next process's sweep takes it and hangs too.
func TestHangingKeyDoesNotStallTheSweep(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{LockTimeout: 200 * time.Millisecond})
	var hang atomic.Bool
	var others atomic.Int32
	wf := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Foreign("call", func(ctx context.Context, _ *atomicphase.ForeignCall, s *revSt) error {
			if s.Name == "a-hang" && hang.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			if hang.Load() {
				others.Add(1)
			}
			return errors.New("down")
		}, func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	for _, k := range []string{"a-hang", "b", "c"} {
		_, _ = b.runner.Run(b.ctx, wf, revReq(k))
		time.Sleep(2 * time.Millisecond)
	}
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET next_attempt_at = created_at WHERE next_attempt_at IS NOT NULL`)
	require.NoError(t, err)
	hang.Store(true)
	// The hanging call's lease ends (LockTimeout), and the sweep goes on to
	// the other keys, long before the run's own deadline would stop it.
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	start := time.Now()
	_, _ = newSweeper(t, b, nil).RunOnce(ctx)
	t.Logf("RunOnce returned after %s (LockTimeout 200ms); other keys tried: %d", time.Since(start).Round(time.Millisecond), others.Load())
	require.NoError(t, ctx.Err(), "one hanging key held the sweep until its deadline")
	require.Equal(t, int32(2), others.Load(), "the sweep went on to the other keys")
}

// R15: keys the sweeping Runner's Resume refuses before touching the row
// (here: longer than its MaxKeyLength, accepted by a Runner configured with
// a larger one) are never backed off, parked or reordered: they stay at
// the head of ORDER BY updated_at and fill every batch, so other abandoned
// keys are never resumed.
func TestSweepResumesKeysOfAnyLength(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxKeyLength: 400, AttemptBackoff: time.Millisecond})
	var fail atomic.Bool
	fail.Store(true)
	wf := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			if fail.Load() {
				return atomicphase.Outcome{}, errors.New("down")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	long := strings.Repeat("x", 300)
	for i := range 5 {
		_, _ = b.runner.Run(b.ctx, wf, revReq(fmt.Sprintf("%s%d", long, i)))
	}
	time.Sleep(5 * time.Millisecond)
	_, _ = b.runner.Run(b.ctx, wf, revReq("short"))
	fail.Store(false)
	time.Sleep(5 * time.Millisecond)
	sweeper, err := atomicphase.NewRunner(b.db.Pool, nil) // default MaxKeyLength 255
	require.NoError(t, err)
	require.NoError(t, sweeper.Register(wf))
	s, err := atomicphase.NewSweeper(sweeper, &atomicphase.SweepConfig{BatchSize: 5})
	require.NoError(t, err)
	for range 10 {
		res, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		t.Logf("%+v", res)
	}
	info, err := b.runner.Inspect(b.ctx, "u", "short")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "starved behind keys the sweep can never resume")
}

// Parked keys count toward MaxUnfinishedPerScope: a client whose requests
// keep failing permanently runs into the cap (429) instead of minting
// parked keys without limit; once an operator forgets them, new keys are
// taken again. Before, 20 such requests under a cap of 2 left 20 parked
// keys.
func TestParkedKeysCountTowardTheScopeCap(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxUnfinishedPerScope: 2})
	wf := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("bad account"))
		}),
	}, nil)
	tooMany := 0
	for i := range 20 {
		_, err := b.runner.Run(b.ctx, wf, revReq(fmt.Sprint("k", i)))
		if errors.Is(err, atomicphase.ErrTooManyKeys) {
			tooMany++
		}
	}
	require.Equal(t, 18, tooMany)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE parked_at IS NOT NULL`))
	for _, k := range []string{"k0", "k1"} {
		require.NoError(t, b.runner.Forget(b.ctx, "u", k))
	}
	_, err := b.runner.Run(b.ctx, wf, revReq("after"))
	require.NotErrorIs(t, err, atomicphase.ErrTooManyKeys)
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
}

// R17: during a rolling deploy that adds a phase, an old process's sweep
// parks keys the new version left at the new phase (unknown recovery
// point: permanent), instead of leaving them to the new processes as it
// leaves unknown workflows.
func TestOldVersionSweepLeavesNewVersionKeysAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{FaultInjector: crashOnce("c", atomicphase.BeforePhase)})
	ok := func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
		return atomicphase.Continue(), nil
	}
	done := func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
		return atomicphase.Respond(200, nil), nil
	}
	v2 := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("a", ok), atomicphase.Local("b_new", ok), atomicphase.Local("c", done)},
		&atomicphase.WorkflowOpts{CommitEachPhase: true}) // b_new's recovery point is committed
	// The newer process runs a sweep, which records the version it runs.
	require.NoError(t, b.runner.Register(v2))
	_, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, v2, revReq("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed) // died after b_new committed
	ageLocks(t, b)
	old, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	v1 := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("a", ok), atomicphase.Local("c", done)}, nil)
	require.NoError(t, old.Register(v1))
	s, err := atomicphase.NewSweeper(old, nil)
	require.NoError(t, err)
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	info, _ := b.runner.Inspect(b.ctx, "u", "k")
	require.Equal(t, 1, res.OtherVersion, "left for the processes that run the newer workflow")
	require.Zero(t, res.Examined, "not even taken")
	require.NotEqual(t, atomicphase.KeyParked, info.Status)
}

// R4b: R4 with the sweep as the newer attempt: the client's only answer is
// "failed permanently, parked" while the sweep finished its request 201.
func TestClientNotToldParkedWhenTheSweepFinished(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int32
	inCall, release := make(chan struct{}), make(chan struct{})
	wf := atomicphase.MustWorkflow("slow", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *revSt) error {
			if n.Add(1) == 1 {
				close(inCall)
				<-release
				return atomicphase.Permanent(errors.New("declined"))
			}
			return nil
		}, func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("ok")), nil
		}),
	}, nil)
	errc := make(chan error)
	go func() { _, err := b.runner.Run(b.ctx, wf, revReq("k")); errc <- err }()
	<-inCall
	ageLocks(t, b)
	res, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	close(release)
	err = <-errc
	info, _ := b.runner.Inspect(b.ctx, "u", "k")
	t.Logf("sweep %+v; key %s %d; client got Retryable=%v %v", res, info.Status, info.Response.Status, atomicphase.Retryable(err), err)
	require.True(t, atomicphase.Retryable(err) || errors.Is(err, atomicphase.ErrLockLost))
}
