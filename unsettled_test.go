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

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// parkUnknown pays through a bank that acts and loses its answer, with
// reconciliation down, until the key's attempts are spent: the key is
// parked with its payout's outcome unknown, as a new user's service had
// it. It returns the key's info.
func parkUnknown(t *testing.T, b *testBundle, bk *bank, wf *atomicphase.Workflow[payout], key string) *atomicphase.KeyInfo {
	t.Helper()
	bk.fail = []string{"act-then-lose"}
	bk.lookupDown.Store(1000)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest(key))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	_, err = b.runner.Run(b.ctx, wf, payoutRequest(key)) // the last attempt: reconciliation fails
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Parked, "%v", err)
	info, err := b.runner.Inspect(b.ctx, "driver_1", key)
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.NotNil(t, info.UnknownAt)
	require.True(t, info.Unsettled)
	require.Len(t, bk.payouts, 1, "the bank paid once")
	return info
}

// A parked key whose payout's outcome is unknown is not forgotten, one by
// one or in bulk, nor reaped by the sweep: each of those let the client's
// retry record the key anew, with a new salt, and the bank paid twice.
// The dry run flags it; ForgetForced with a reason deletes it and leaves
// the reason, and the downstream reference, in the audit trail.
// (Nothing that may have paid is forgotten.)
func TestUnsettledParkedKeyIsNeitherForgottenNorReaped(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
	bk := newBank()
	wf := payoutWorkflow(bk)
	info := parkUnknown(t, b, bk, wf, "p")
	ref, _ := bk.only(t)
	require.Equal(t, ref, info.DownstreamKeys["pay"], "Inspect names the reference the bank knows")

	require.ErrorIs(t, b.runner.Forget(b.ctx, "driver_1", "p"), atomicphase.ErrOutcomeUnsettled)

	listed, err := b.runner.ForgetKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyParked}, &atomicphase.BulkOpts{DryRun: true})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.True(t, listed[0].Unsettled, "the dry run flags it")
	forgot, err := b.runner.ForgetKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyParked}, nil)
	require.NoError(t, err)
	require.Empty(t, forgot, "the bulk forget skips it")

	n, err := b.runner.ReapParked(b.ctx, 0, 100)
	require.NoError(t, err)
	require.Zero(t, n, "the reaper leaves it")
	_, err = b.runner.ForgetKeys(b.ctx, nil, &atomicphase.BulkOpts{Force: true})
	require.ErrorContains(t, err, "Reason", "force needs a reason")

	// The client retries (a key parked by spent attempts is resumed by a
	// retry, which reconciles again): still the one payout.
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("p"))
	require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
	require.Len(t, bk.payouts, 1, "one payout")
	require.EqualValues(t, 1, bk.calls.Load(), "the call was not sent again")

	// The operator checked with the bank and gives the key up.
	require.ErrorContains(t, b.runner.ForgetForced(b.ctx, "driver_1", "p", "alice", ""), "reason")
	require.NoError(t, b.runner.ForgetForced(b.ctx, "driver_1", "p", "alice", "bank confirmed payout po_1 by phone"))
	_, err = b.runner.Inspect(b.ctx, "driver_1", "p")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)
	trail, err := b.runner.AuditTrail(b.ctx, "driver_1", "p", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "forget", trail[0].Action)
	require.Equal(t, "alice", trail[0].Actor)
	require.Equal(t, "bank confirmed payout po_1 by phone", trail[0].Note)
	var detail struct {
		Forced         bool              `json:"forced"`
		DownstreamKeys map[string]string `json:"downstream_keys"`
		UnknownAt      *time.Time        `json:"unknown_at"`
	}
	require.NoError(t, json.Unmarshal(trail[0].Detail, &detail))
	require.True(t, detail.Forced)
	require.NotNil(t, detail.UnknownAt)
	require.Equal(t, ref, detail.DownstreamKeys["pay"])
}

// The bulk forget with Force, an actor and a reason forgets such keys too,
// each with its own entry in the audit trail.
func TestForcedBulkForgetIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
	bk := newBank()
	wf := payoutWorkflow(bk)
	parkUnknown(t, b, bk, wf, "p")
	forgot, err := b.runner.ForgetKeys(b.ctx, nil, &atomicphase.BulkOpts{Force: true, Actor: "bob", Reason: "settled with the bank"})
	require.NoError(t, err)
	require.Len(t, forgot, 1)
	trail, err := b.runner.AuditTrail(b.ctx, "driver_1", "p", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "bob", trail[0].Actor)
	require.Equal(t, "settled with the bank", trail[0].Note)
}

// The reproduction: after each way of deleting the parked, unknown key
// (forget, bulk forget, the reap), the client retries with the bank and
// its lookups healthy again. Before, each deleted the key, the retry
// recorded it anew with a new salt, and the bank got a second reference:
// two payouts.
func TestNoOperatorActionOrSweepPaysTwice(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"forget", "bulk-forget", "reap"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
			bk := newBank()
			wf := payoutWorkflow(bk)
			bk.fail = []string{"act-then-lose"}
			bk.lookupDown.Store(1) // the last attempt's reconciliation fails
			for range 2 {
				_, err := b.runner.Run(b.ctx, wf, payoutRequest("p"))
				require.Error(t, err)
			}
			info, err := b.runner.Inspect(b.ctx, "driver_1", "p")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyParked, info.Status)
			switch how {
			case "forget":
				_ = b.runner.Forget(b.ctx, "driver_1", "p")
			case "bulk-forget":
				_, err = b.runner.ForgetKeys(b.ctx, nil, nil)
				require.NoError(t, err)
			case "reap":
				_, err = b.runner.ReapParked(b.ctx, 0, 100)
				require.NoError(t, err)
			}
			resp, err := b.runner.Run(b.ctx, wf, payoutRequest("p"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			require.Len(t, bk.payouts, 1, "one payout reference at the bank")
			require.EqualValues(t, 1, bk.calls.Load(), "one call")
		})
	}
}

// A key that paid and then parked is not given up either, whatever parked
// it: a refusal in the foreign phase's own record step (the recovery point
// still at started, no unknown outcome, no call mark), a refusal in a later
// phase (the charge committed), or a record step that failed until the
// key's attempts ran out, for a bank without idempotency keys once its
// call's quiet period passed. Before, each read as settled, was forgotten
// or reaped, and the retry paid again under a new downstream key.
func TestPaidAndParkedKeyIsNeitherForgottenNorReaped(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"record-forget", "record-bulk-forget", "record-reap", "later-phase-bulk-forget", "record-down-bulk-forget"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, shopDBOpts, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
			var mu sync.Mutex
			charges := map[string]int{}
			var ledgerDown atomic.Bool
			ledgerDown.Store(how == "record-down-bulk-forget")
			insert := func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
				if ledgerDown.Load() {
					return atomicphase.Outcome{}, errors.New("ledger down")
				}
				if _, err := tx.Exec(ctx, `INSERT INTO orders (scope, product_id, quantity) VALUES ('u', $1, $2)`, s.Product, s.Quantity); err != nil {
					return atomicphase.Outcome{}, fmt.Errorf("receipt: %w", err)
				}
				return atomicphase.Respond(201, []byte("ordered")), nil
			}
			charge := func(ctx context.Context, call *atomicphase.ForeignCall, s *buyIn) error {
				return call.Do(ctx, func(ctx context.Context, key string) error {
					mu.Lock()
					defer mu.Unlock()
					charges[key]++
					return nil
				})
			}
			phases := []atomicphase.Phase[buyIn]{atomicphase.Foreign("charge", charge, insert)}
			if how == "later-phase-bulk-forget" {
				phases = []atomicphase.Phase[buyIn]{atomicphase.Foreign("charge", charge, nil), atomicphase.Local("receipt", insert)}
			}
			wf := atomicphase.MustWorkflow("paid", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil }, phases, nil)
			quantity := 0 // refused by the CHECK
			if how == "record-down-bulk-forget" {
				quantity = 1
			}
			for range 2 {
				_, err := b.runner.Run(b.ctx, wf, buyRequest("order-1", 1, quantity))
				var pe *atomicphase.PhaseError
				require.ErrorAs(t, err, &pe)
				if pe.Parked {
					break
				}
			}
			info, err := b.runner.Inspect(b.ctx, "u", "order-1")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyParked, info.Status)
			require.True(t, info.Unsettled, "a key that paid is unsettled")
			require.NotNil(t, info.CalledAt)

			switch how {
			case "record-forget":
				require.ErrorIs(t, b.runner.Forget(b.ctx, "u", "order-1"), atomicphase.ErrOutcomeUnsettled)
			case "record-reap":
				n, err := b.runner.ReapParked(b.ctx, 0, 100)
				require.NoError(t, err)
				require.Zero(t, n)
			default:
				got, err := b.runner.ForgetKeys(b.ctx, nil, nil)
				require.NoError(t, err)
				require.Empty(t, got)
			}
			ledgerDown.Store(false)
			_, _ = b.runner.Run(b.ctx, wf, buyRequest("order-1", 1, quantity))
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, charges, 1, "one downstream key: %v", charges)
		})
	}
}

// A forced forget from a process that has not registered the key's
// workflow (the CLI) still keeps what the payment can be found by: the
// key's downstream salt, from which the downstream keys derive.
func TestForcedForgetKeepsTheSaltWithoutTheWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
	bk := newBank()
	info := parkUnknown(t, b, bk, payoutWorkflow(bk), "p")
	require.NotEmpty(t, info.DownstreamSalt)
	op, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, op.ForgetForced(b.ctx, "driver_1", "p", "alice", "settled with the bank"))
	trail, err := op.AuditTrail(b.ctx, "driver_1", "p", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Contains(t, string(trail[0].Detail), info.DownstreamSalt)
	ref, _ := bk.only(t)
	require.Equal(t, ref, atomicphase.DownstreamKeyOf(info.DownstreamSalt, "payout", "driver_1", "p", "pay"),
		"the reference the bank knows derives from what the trail kept")
}
