package atomicphase_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A verdict settles a call's outcome; it fixes no bug. A key parked for
// good because its code panicked (here, its reconcile function) keeps the
// verdict and stays parked, its attempts as they were: neither the sweep
// nor a client's retry runs it, until an operator unparks it. Then the
// attempt that resumes it takes the verdict, and the call is not made
// again.
func TestAVerdictLeavesAKeyParkedForABugParked(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	bk.fail = []string{"act-then-lose"}
	var bug atomic.Bool
	wf := payoutWorkflowReconciling(bk, &bug)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)

	bug.Store(true)
	_, _, panicked := runSafely(b.runner, wf, payoutRequest("k"))
	require.True(t, panicked)
	parked, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, parked.Status)
	require.NotNil(t, parked.UnknownAt)
	shiftTimes(t, b, time.Hour, false) // past the call's quiet period, which a verdict waits for
	parked, err = b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)

	// The bank's webhook says the payout went out.
	require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", true, "bank webhook: po_1 paid"))
	info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status, "a key parked for a bug stays parked")
	require.Equal(t, parked.Attempts, info.Attempts, "its attempts as they were")
	require.NotNil(t, info.ResolvedHappened)
	require.True(t, *info.ResolvedHappened, "the verdict is kept")
	h, err := b.runner.KeyHistory(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	last := h[len(h)-1]
	require.Equal(t, [3]string{"resolved", "parked", "parked"}, [3]string{last.Event, last.StatusBefore, last.Status})

	bug.Store(false) // the fix is deployed, but nobody has unparked the key
	res, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.Completed, "the sweep leaves a parked key alone")
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrParked, "a client's retry is refused too")

	require.NoError(t, b.runner.Unpark(b.ctx, "driver_1", "k"))
	bk.lookupDown.Store(1000) // the verdict decides, not the lookup
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.EqualValues(t, 1, bk.calls.Load(), "the call was never made again")
	_, ids := bk.only(t)
	require.Len(t, ids, 1)
}

// A key parked because its attempts ran out is what a verdict is for: it
// is made due at once, with a fresh budget of attempts
// (TestRecordResolutionResetsTheAttempts). Both kinds of parked key, side
// by side, so that the difference is seen.
func TestAVerdictMovesOnlyAKeyParkedForItsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Millisecond, MaxAttempts: 2, CallGrace: time.Nanosecond})
	bk := newBank()
	bk.fail = []string{"act-then-lose", "act-then-lose"}
	var bug atomic.Bool
	wf := payoutWorkflowReconciling(bk, &bug)
	for _, key := range []string{"exhausted", "bug"} {
		_, err := b.runner.Run(b.ctx, wf, payoutRequest(key))
		require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	}
	bk.lookupDown.Store(1) // the exhausted key's second attempt cannot tell
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("exhausted"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	bug.Store(true)
	_, _, panicked := runSafely(b.runner, wf, payoutRequest("bug"))
	require.True(t, panicked)
	bug.Store(false)
	shiftTimes(t, b, time.Hour, false) // past the calls' quiet periods, which a verdict waits for
	for key, due := range map[string]bool{"exhausted": true, "bug": false} {
		info, err := b.runner.Inspect(b.ctx, "driver_1", key)
		require.NoError(t, err)
		require.Equal(t, atomicphase.KeyParked, info.Status, key)
		require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", key, true, "checked"))
		info, err = b.runner.Inspect(b.ctx, "driver_1", key)
		require.NoError(t, err)
		require.Equal(t, due, info.Status != atomicphase.KeyParked, "%s: made due by its verdict", key)
	}
}

// payoutWorkflowReconciling is payoutWorkflow whose reconcile function
// panics while bug is set.
func payoutWorkflowReconciling(bk *bank, bug *atomic.Bool) *atomicphase.Workflow[payout] {
	return atomicphase.MustWorkflow("payout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				id, err := bk.pay(ctx, ref)
				p.PayoutID = id
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(p.PayoutID)), nil
		}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			if bug.Load() {
				panic("reconcile bug")
			}
			ids, err := bk.lookup(call.Key())
			if err != nil || len(ids) == 0 {
				return false, err
			}
			p.PayoutID = ids[0]
			return true, nil
		}),
	}, nil)
}

// Unpark acts on a parked key only: on a key waiting for its next attempt
// it refuses, changing nothing (its attempts stay counted); MakeDue is
// what clears such a key's backoff, and refuses a parked key.
func TestUnparkRefusesAKeyThatIsNotParked(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Hour})
	var fail atomic.Bool
	type st struct{}
	wf := atomicphase.MustWorkflow("w", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			if fail.Load() {
				return atomicphase.Outcome{}, errors.New("transient")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := func(key string) atomicphase.Request {
		return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/"}
	}
	fail.Store(true)
	for range 2 {
		_, err := b.runner.Run(b.ctx, wf, req("waiting"))
		require.Error(t, err)
	}
	before, err := b.runner.Inspect(b.ctx, "u", "waiting")
	require.NoError(t, err)
	require.Equal(t, 2, before.Attempts)
	require.True(t, before.NextAttemptAt.After(time.Now()), "backing off")

	require.ErrorIs(t, b.runner.Unpark(b.ctx, "u", "waiting"), atomicphase.ErrKeyNotParked)
	after, err := b.runner.Inspect(b.ctx, "u", "waiting")
	require.NoError(t, err)
	require.Equal(t, before.Attempts, after.Attempts, "nothing changed")
	require.Equal(t, before.NextAttemptAt, after.NextAttemptAt, "nothing changed")

	require.NoError(t, b.runner.MakeDue(b.ctx, "u", "waiting"))
	after, err = b.runner.Inspect(b.ctx, "u", "waiting")
	require.NoError(t, err)
	require.Equal(t, before.Attempts, after.Attempts, "MakeDue keeps the attempts")
	require.False(t, after.NextAttemptAt.After(time.Now()), "due at once")

	parkKeys(t, b, "parks", map[string]string{"parked": "bad"})
	require.ErrorIs(t, b.runner.MakeDue(b.ctx, "u", "parked"), atomicphase.ErrKeyParked)
	require.NoError(t, b.runner.Unpark(b.ctx, "u", "parked"))

	fail.Store(false)
	_, err = b.runner.Run(b.ctx, wf, req("done"))
	require.NoError(t, err)
	require.ErrorIs(t, b.runner.Unpark(b.ctx, "u", "done"), atomicphase.ErrKeyFinished)
	require.ErrorIs(t, b.runner.MakeDue(b.ctx, "u", "done"), atomicphase.ErrKeyFinished)
	require.ErrorIs(t, b.runner.Unpark(b.ctx, "u", "never"), atomicphase.ErrKeyNotFound)
	require.ErrorIs(t, b.runner.MakeDue(b.ctx, "u", "never"), atomicphase.ErrKeyNotFound)
}

// A client that retries while a key's reconciliation backs off (the
// downstream's lookup is down) is answered at once, told when to come
// back, and counts nothing: attempts count the library's tries, not the
// client's patience, so an outage of the lookup parks nothing by client
// retries alone. Once the backoff ends, a retry reconciles.
func TestARetryDuringAReconcileBackoffCountsNothing(t *testing.T) {
	t.Parallel()
	var noBug atomic.Bool
	for name, wf := range map[string]func(*bank) *atomicphase.Workflow[payout]{
		"recorded with its first unit": payoutWorkflow,
		"acquired on its own":          func(bk *bank) *atomicphase.Workflow[payout] { return payoutWorkflowReconciling(bk, &noBug) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			retryDuringAReconcileBackoff(t, wf)
		})
	}
}

func retryDuringAReconcileBackoff(t *testing.T, workflow func(*bank) *atomicphase.Workflow[payout]) {
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, AttemptBackoff: time.Hour, MaxAttempts: 3})
	bk := newBank()
	bk.fail = []string{"act-then-lose"}
	wf := workflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	// The first retry reconciles at once, but the lookup is down.
	bk.lookupDown.Store(1)
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	before, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, 2, before.Attempts)
	lookups := bk.lookups.Load()

	for range 10 {
		_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
		var inProgress *atomicphase.InProgressError
		require.ErrorAs(t, err, &inProgress, "answered at once while the reconciliation backs off")
		require.InDelta(t, time.Until(*before.NextAttemptAt).Seconds(), inProgress.RetryAfter.Seconds(), 5,
			"told to come back when the backoff ends")
	}
	after, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, before.Attempts, after.Attempts, "the client's retries counted no attempt")
	require.Equal(t, atomicphase.KeyUnknown, after.Status, "nothing parked it")
	require.Equal(t, lookups, bk.lookups.Load(), "and asked the downstream nothing")

	shiftTimes(t, b, 2*time.Hour, false) // the backoff is over
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.EqualValues(t, 1, bk.calls.Load(), "reconciled, never paid again")
}

// A webhook's resolution (ResolveUnknown) does not resume a key parked
// for good either: it is refused, changing nothing, and the webhook
// records its verdict instead, kept for when an operator unparks the key.
func TestAWebhooksResolutionLeavesAKeyParkedForABugParked(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	bk.fail = []string{"act-then-lose"}
	var bug atomic.Bool
	wf := payoutWorkflowReconciling(bk, &bug)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	bug.Store(true)
	_, _, panicked := runSafely(b.runner, wf, payoutRequest("k"))
	require.True(t, panicked)
	shiftTimes(t, b, time.Hour, false) // past the call's quiet period
	before, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.True(t, before.ParkedForGood)

	_, err = atomicphase.ResolveUnknown(b.ctx, b.runner, wf, "driver_1", "k", func(p *payout) (bool, error) {
		p.PayoutID = "po_1"
		return true, nil
	})
	require.ErrorIs(t, err, atomicphase.ErrParked)
	after, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, after.Status, "left parked")
	require.Nil(t, after.Response)
	require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", true, "bank webhook: po_1"))
	require.EqualValues(t, 1, bk.calls.Load())
}
