package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// bank is a downstream without idempotency keys, as a legacy payout API is:
// every call it takes effect on is a payout. It counts payouts per
// reference, and answers lookups by reference.
type bank struct {
	mu      sync.Mutex
	payouts map[string][]string // reference → payout ids
	calls   atomic.Int32
	// fail says how the next calls go wrong (consumed one per call).
	fail []string // "act-then-lose", "act-then-5xx", "refuse-5xx", "timeout"
	// lookupDown makes lookups fail while positive (counted down per lookup).
	lookupDown atomic.Int32
	lookups    atomic.Int32
	// gate, when set, is passed by every call before it acts.
	gate func()
}

func newBank() *bank { return &bank{payouts: map[string][]string{}} }

var errBank = errors.New("bank: 503")

func (b *bank) pay(ctx context.Context, ref string) (string, error) {
	b.calls.Add(1)
	if b.gate != nil {
		b.gate()
	}
	b.mu.Lock()
	mode := ""
	if len(b.fail) > 0 {
		mode, b.fail = b.fail[0], b.fail[1:]
	}
	act := func() string {
		id := fmt.Sprintf("po_%d", len(b.payouts[ref])+1)
		b.payouts[ref] = append(b.payouts[ref], id)
		return id
	}
	defer b.mu.Unlock()
	switch mode {
	case "act-then-lose":
		act()
		return "", errors.New("connection reset after sending")
	case "act-then-5xx":
		act()
		return "", errBank
	case "refuse-5xx":
		return "", errBank
	case "timeout":
		act()
		return "", context.DeadlineExceeded
	}
	return act(), nil
}

func (b *bank) lookup(ref string) ([]string, error) {
	b.lookups.Add(1)
	if b.lookupDown.Add(-1) >= 0 {
		return nil, errors.New("bank: lookup down")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.payouts[ref]...), nil
}

func (b *bank) only(t *testing.T) (string, []string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Len(t, b.payouts, 1, "one reference")
	for ref, ids := range b.payouts {
		return ref, ids
	}
	return "", nil
}

type payout struct {
	PayoutID string `json:"payout_id,omitempty"`
}

// payoutWorkflow pays through the bank with the downstream key as the
// reference, reconciling by that reference.
func payoutWorkflow(bk *bank) *atomicphase.Workflow[payout] {
	return atomicphase.MustWorkflow("payout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				id, err := bk.pay(ctx, ref)
				p.PayoutID = id
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(p.PayoutID)), nil
		}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			ids, err := bk.lookup(call.Key())
			if err != nil || len(ids) == 0 {
				return false, err
			}
			p.PayoutID = ids[0]
			return true, nil
		}),
	}, nil)
}

// syncBankConfig is the Runner's configuration for the bank above, which
// acts before it answers: once a call has returned nothing of it is in
// flight, and a retry may reconcile at once (Config.CallGrace is for
// downstreams that may act after their caller gave up; see lease_test.go).
func syncBankConfig() *atomicphase.Config {
	return &atomicphase.Config{CallGrace: time.Nanosecond}
}

func payoutRequest(key string) atomicphase.Request {
	return atomicphase.Request{Scope: "driver_1", Key: key, Method: "POST", Path: "/payouts"}
}

// Each way a payout's outcome becomes unknown, retried to the end: exactly
// one payout at the bank, and the workflow finishes with it recorded.
func TestUnknownOutcomeIsReconciledNotRepeated(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"act-then-lose", "act-then-5xx", "timeout"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, syncBankConfig())
			bk := newBank()
			bk.fail = []string{mode}
			wf := payoutWorkflow(bk)
			_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
			require.True(t, atomicphase.Retryable(err))
			info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyUnknown, info.Status)
			require.NotNil(t, info.UnknownAt)
			require.NotNil(t, info.NextAttemptAt, "when to reconcile")

			resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.NoError(t, err)
			ref, ids := bk.only(t)
			require.Len(t, ids, 1, "one payout for %s", ref)
			require.Equal(t, ids[0], string(resp.Body), "the payout found is the one recorded")
			require.EqualValues(t, 1, bk.calls.Load(), "the call was never sent again")
			info, err = b.runner.Inspect(b.ctx, "driver_1", "k")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyFinished, info.Status)
			require.Nil(t, info.UnknownAt, "the commit cleared the mark")
		})
	}
}

// A process killed right after the call was sent leaves no mark at all; the
// attempt that resumes into the phase reconciles first all the same.
func TestCrashAfterTheCallIsReconciled(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{FaultInjector: crashOnce("pay", atomicphase.AfterForeign)})
	bk := newBank()
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	_, ids := bk.only(t)
	require.Equal(t, []string{string(resp.Body)}, ids)
	require.EqualValues(t, 1, bk.calls.Load())
	require.EqualValues(t, 1, bk.lookups.Load())
}

// When the bank never acted, reconciliation says so and the call is made,
// once.
func TestNotHappenedIsCalledOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	bk.fail = []string{"refuse-5xx"}
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown, "a 5xx may have executed")
	require.Zero(t, len(bk.payouts), "this bank did not act")
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	_, ids := bk.only(t)
	require.Equal(t, []string{string(resp.Body)}, ids)
	require.EqualValues(t, 2, bk.calls.Load(), "the refused call and the one made after reconciliation")
}

// While reconciliation cannot tell, retries answer "unknown" (409 over
// HTTP) and send nothing, and a retry before the reconciliation's backoff
// ends is answered "in progress", trying nothing; afterwards the request
// finishes with one payout.
func TestReconcileFailingForAWhileSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	bk.fail = []string{"act-then-lose"}
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	bk.lookupDown.Store(3)
	for i := range 3 {
		if i > 0 {
			_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.ErrorIs(t, err, atomicphase.ErrInProgress, "the reconciliation backs off")
			shiftTimes(t, b, time.Hour, false)
		}
		_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
		require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	}
	require.EqualValues(t, 3, bk.lookups.Load(), "one lookup per reconciliation")
	require.EqualValues(t, 1, bk.calls.Load(), "no call while the outcome was unknown")
	shiftTimes(t, b, time.Hour, false)
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	_, ids := bk.only(t)
	require.Equal(t, []string{string(resp.Body)}, ids)
	require.EqualValues(t, 1, bk.calls.Load())
}

// The sweep reconciles an unknown outcome with no client involved, after
// the reconcile-after time; a reconcile that keeps failing parks the key.
func TestSweepReconcilesAndParksWhatItCannotTell(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Millisecond, MaxAttempts: 3, CallGrace: time.Nanosecond})
	bk := newBank()
	bk.fail = []string{"act-then-5xx", "act-then-5xx"}
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("done"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("stuck"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	require.EqualValues(t, 2, bk.calls.Load())

	time.Sleep(5 * time.Millisecond) // past the reconcile-after times
	bk.lookupDown.Store(100)
	s := newSweeper(t, b, nil)
	for range 3 {
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	for _, key := range []string{"done", "stuck"} {
		info, err := b.runner.Inspect(b.ctx, "driver_1", key)
		require.NoError(t, err)
		require.Equal(t, atomicphase.KeyParked, info.Status, key)
		require.Contains(t, *info.LastError, "reconcile")
	}
	require.EqualValues(t, 2, bk.calls.Load(), "nothing sent while the outcome was unknown")

	bk.lookupDown.Store(0)
	require.NoError(t, b.runner.Unpark(b.ctx, "driver_1", "done"))
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)
	info, err := b.runner.Inspect(b.ctx, "driver_1", "done")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.EqualValues(t, 2, bk.calls.Load())
}

// A webhook telling the outcome and a sweep reconciling at the same time:
// exactly one resolution is applied, fenced like any attempt.
func TestResolveUnknownRacesTheSweep(t *testing.T) {
	t.Parallel()
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{AttemptBackoff: time.Millisecond, CallGrace: time.Nanosecond})
			bk := newBank()
			bk.fail = []string{"act-then-lose"}
			wf := payoutWorkflow(bk)
			_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
			time.Sleep(3 * time.Millisecond)
			_, ids := bk.only(t)

			var applied atomic.Int32
			var wg sync.WaitGroup
			wg.Add(2)
			var hookErr error
			go func() {
				defer wg.Done()
				_, hookErr = atomicphase.ResolveUnknown(b.ctx, b.runner, wf, "driver_1", "k", func(p *payout) (bool, error) {
					applied.Add(1)
					p.PayoutID = ids[0]
					return true, nil
				})
			}()
			go func() {
				defer wg.Done()
				_, err := newSweeper(t, b, nil).RunOnce(b.ctx)
				require.NoError(t, err)
			}()
			wg.Wait()
			if hookErr != nil {
				require.ErrorIs(t, hookErr, atomicphase.ErrInProgress, "the sweep held the key")
			}
			info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyFinished, info.Status)
			require.Equal(t, ids[0], string(info.Response.Body))
			require.EqualValues(t, 1, bk.calls.Load())
			require.LessOrEqual(t, applied.Load()+bk.lookups.Load(), int32(1), "one resolution")
		})
	}
}

// ResolveUnknown on a key that is not waiting at a reconcilable phase
// changes nothing.
func TestResolveUnknownRefusesOtherKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	wf := payoutWorkflow(bk)
	var c counters
	other := orderWorkflow(t, &c, hooks{finish: func(context.Context, pgx.Tx, *orderState) error { return errors.New("transient") }})
	_, err := b.runner.Run(b.ctx, other, orderRequest("driver_1", "order"))
	require.Error(t, err)
	_, err = atomicphase.ResolveUnknown(b.ctx, b.runner, wf, "driver_1", "order", func(*payout) (bool, error) { return true, nil })
	require.ErrorIs(t, err, atomicphase.ErrNotUnknown)
	info, err := b.runner.Inspect(b.ctx, "driver_1", "order")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status, "released as it was")
}

// An operator who checked with the bank settles an unknown outcome by
// hand: the verdict is recorded in the row and the next attempt follows it
// once, whatever the lookup says (it is down here).
func TestRecordResolutionByHand(t *testing.T) {
	t.Parallel()
	for _, happened := range []bool{true, false} {
		t.Run(fmt.Sprint(happened), func(t *testing.T) {
			t.Parallel()
			b := setup(t, syncBankConfig())
			bk := newBank()
			mode := "refuse-5xx"
			if happened {
				mode = "act-then-lose"
			}
			bk.fail = []string{mode}
			wf := payoutWorkflow(bk)
			_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
			bk.lookupDown.Store(1000)

			require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", happened, "checked the bank's portal: ops@"))
			info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
			require.NoError(t, err)
			require.NotNil(t, info.ResolvedHappened)
			require.Equal(t, happened, *info.ResolvedHappened)
			require.Equal(t, "checked the bank's portal: ops@", *info.ResolvedNote)
			require.NotNil(t, info.NextAttemptAt)
			require.False(t, info.NextAttemptAt.After(time.Now()), "due at once")

			resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			_, ids := bk.only(t)
			require.Len(t, ids, 1, "exactly one payout either way")
			wantCalls := int32(1)
			if !happened {
				wantCalls = 2 // the refused call and the one the verdict allowed
			}
			require.Equal(t, wantCalls, bk.calls.Load())
			info, err = b.runner.Inspect(b.ctx, "driver_1", "k")
			require.NoError(t, err)
			require.Equal(t, happened, *info.ResolvedHappened, "the verdict stays on record")

			require.ErrorIs(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", happened, ""), atomicphase.ErrKeyFinished)
		})
	}
}

// The runbook's own case: a key parked because reconciliation failed
// MaxAttempts times. The operator's verdict gives it a fresh budget of
// attempts, as Unpark does, so the sweep reads the verdict instead of
// parking the key again at once ("3 attempts never finished").
func TestRecordResolutionResetsTheAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{AttemptBackoff: time.Millisecond, MaxAttempts: 3, CallGrace: time.Nanosecond})
	bk := newBank()
	bk.fail = []string{"act-then-5xx"}
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	bk.lookupDown.Store(1000)
	s := newSweeper(t, b, nil)
	for range 4 {
		time.Sleep(5 * time.Millisecond)
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)

	require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", true, "payout po_1 seen in the bank's portal (ops)"))
	info, err = b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, 1, info.Attempts, "a fresh budget, as Unpark gives")
	bk.lookupDown.Store(1000) // the reconcile function still cannot tell: the verdict decides
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed, "the sweep applied the verdict: %+v", res)
	info, err = b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.EqualValues(t, 1, bk.calls.Load(), "happened: the call is not made again")
}

// A verdict on a key whose phase has no reconcile function would change
// nothing (its call is simply made again, under its downstream key): it is
// refused, recording nothing, with what to do instead.
func TestRecordResolutionRefusesAKeyWithoutUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 1})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(context.Context, *atomicphase.ForeignCall, *orderState) error {
		return errors.New("payment API unreachable")
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.Error(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)

	err = b.runner.RecordResolution(b.ctx, "u", "k", true, "ops")
	require.ErrorIs(t, err, atomicphase.ErrNoUnknownOutcome)
	require.Contains(t, err.Error(), "unpark")
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Nil(t, info.ResolvedHappened, "nothing recorded")
	require.Equal(t, atomicphase.KeyParked, info.Status, "left as it was")
}

// A call to a downstream without idempotency keys that answers a refusal
// (nothing created) through Answer is no unknown outcome: the client gets
// the workflow's answer, and the retry, after the lookup finds nothing,
// calls again.
func TestAnswerIsNoUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	refused := true
	wf := atomicphase.MustWorkflow("payout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				if refused {
					refused = false
					return atomicphase.Answer(503, []byte("the bank is closed; nothing was paid"), errors.New("bank: 403 closed"))
				}
				id, err := bk.pay(ctx, ref)
				p.PayoutID = id
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(p.PayoutID)), nil
		}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			ids, err := bk.lookup(call.Key())
			if err != nil || len(ids) == 0 {
				return false, err
			}
			p.PayoutID = ids[0]
			return true, nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NotErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	var answer *atomicphase.AnswerError
	require.ErrorAs(t, err, &answer)
	require.Equal(t, 503, answer.Response.Status)
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	_, ids := bk.only(t)
	require.Len(t, ids, 1)
}

// With the lookup down, an operator who read the payout's id off the bank's
// portal records it with the verdict: the reconcile function finds it in
// ForeignCall.OperatorResult, and the response carries it. A verdict
// without the result goes on with an empty id: the state as it is.
func TestRecordResolutionWithTheCallsResult(t *testing.T) {
	t.Parallel()
	for _, withResult := range []bool{true, false} {
		t.Run(fmt.Sprint(withResult), func(t *testing.T) {
			t.Parallel()
			b := setup(t, syncBankConfig())
			bk := newBank()
			bk.fail = []string{"act-then-lose"}
			wf := atomicphase.MustWorkflow("payout", startEmpty[payout], []atomicphase.Phase[payout]{
				atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
					return call.Do(ctx, func(ctx context.Context, ref string) error {
						id, err := bk.pay(ctx, ref)
						p.PayoutID = id
						return err
					})
				}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
					return atomicphase.Respond(201, []byte(p.PayoutID)), nil
				}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
					if res, ok := call.OperatorResult(); ok {
						return true, json.Unmarshal(res, &p.PayoutID)
					}
					ids, err := bk.lookup(call.Key())
					if err != nil || len(ids) == 0 {
						return false, err
					}
					p.PayoutID = ids[0]
					return true, nil
				}),
			}, nil)
			_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
			bk.lookupDown.Store(1000)
			_, ids := bk.only(t)

			if withResult {
				require.ErrorContains(t, b.runner.RecordResolutionWithResult(b.ctx, "driver_1", "k", "portal", []byte(`po_1`)), "not valid JSON")
				require.ErrorContains(t, b.runner.RecordResolutionWithResult(b.ctx, "driver_1", "k", "portal", nil), "needs the call's result")
				require.NoError(t, b.runner.RecordResolutionWithResult(b.ctx, "driver_1", "k", "read off the bank's portal: ops@", []byte(`"`+ids[0]+`"`)))
				info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
				require.NoError(t, err)
				require.JSONEq(t, `"po_1"`, string(info.ResolvedResult))
			} else {
				require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "k", true, "checked the bank's portal: ops@"))
			}
			resp, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			require.Equal(t, int32(1), bk.calls.Load(), "the payout was not made again")
			if withResult {
				require.Equal(t, "po_1", string(resp.Body), "the response carries the id the operator recorded")
			} else {
				require.Empty(t, string(resp.Body), "without the result, the id stays empty")
			}
		})
	}
}
