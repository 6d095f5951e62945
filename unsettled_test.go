package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// chargeOnly is a workflow of one foreign phase that charges (counted by
// downstream key in charges) and responds.
func chargeOnly(mu *sync.Mutex, charges map[string]int) *atomicphase.Workflow[buyIn] {
	return atomicphase.MustWorkflow("charge-only", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil },
		[]atomicphase.Phase[buyIn]{atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *buyIn) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				mu.Lock()
				defer mu.Unlock()
				charges[key]++
				return nil
			})
		}, func(context.Context, atomicphase.Tx, *buyIn) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("charged")), nil
		})}, nil)
}

// A process killed right after its call leaves nothing on the row (a
// downstream with idempotency keys takes no call mark); the sweep that
// then finds the key's attempts spent parks it as one that may have paid,
// since the phase it would resume at is the foreign one an earlier attempt
// reached. Before, it parked it settled, a bulk forget deleted it, and the
// retry charged again under a new downstream key.
func TestSweepParksAKeyThatKilledItsProcessAfterACallAsPaid(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, &atomicphase.Config{MaxAttempts: 1, FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var mu sync.Mutex
	charges := map[string]int{}
	wf := chargeOnly(&mu, charges)
	require.NoError(t, b.runner.Register(wf))
	_, err := b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	_, err = newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.True(t, info.Unsettled, "it may have paid")
	forgot, err := b.runner.ForgetKeys(b.ctx, nil, nil)
	require.NoError(t, err)
	require.Empty(t, forgot)
	require.NoError(t, b.runner.Unpark(b.ctx, "u", "k"))
	_, err = b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1))
	require.NoError(t, err)
	require.Len(t, charges, 1, "one downstream key: %v", charges)
}

// A key a previous release's process parks (the eight-argument release,
// which knows nothing of calls) counts as one that may have paid.
func TestKeyParkedByThePreviousReleaseIsUnsettled(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, &atomicphase.Config{FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var mu sync.Mutex
	wf := chargeOnly(&mu, map[string]int{})
	_, err := b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	var released bool
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT * FROM atomicphase_release('u', 'k', $1, 'failed in 0.2.0', 0, true, false, true)`,
		info.LockToken).Scan(&released))
	require.True(t, released)
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.True(t, info.Unsettled)
	require.ErrorIs(t, b.runner.Forget(b.ctx, "u", "k"), atomicphase.ErrOutcomeUnsettled)
}

// forgetTracer runs hook once, right after the statement that reads a key
// for a forget has answered: between the forget's read and its delete.
type forgetTracer struct {
	once sync.Once
	hook func()
}

func (f *forgetTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "lock_token, unknown_at, call_until") {
		return context.WithValue(ctx, f, true)
	}
	return ctx
}

func (f *forgetTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(f) != nil {
		f.once.Do(f.hook)
	}
}

// A forget that read the key while an attempt still held it, settled, then
// raced the attempt parking it as paid under the same token, deleted it:
// the delete now matches the park and the call mark as read.
func TestForgetDoesNotDeleteAKeyParkedAfterItsRead(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, &atomicphase.Config{FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var mu sync.Mutex
	wf := chargeOnly(&mu, map[string]int{})
	_, err := b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1)) // left held, as by a live attempt
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	cfg := b.db.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = &forgetTracer{hook: func() {
		// The holder parks the key, paid, between the read and the delete.
		_, err := b.db.Pool.Exec(context.Background(), `SELECT * FROM atomicphase_release('u', 'k', $1, 'refused', 0, true, false, true, true)`, info.LockToken)
		if err != nil {
			panic(err)
		}
	}}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	op, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	err = op.Forget(b.ctx, "u", "k")
	require.Error(t, err, "the key changed under the forget")
	_, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err, "the key is still there")
}

// A takeover that fails before it reaches the call (here a permanent
// failure at the phase's start) parks a key whose earlier attempt may have
// called: it counts as paid.
func TestTakeoverThatFailsBeforeTheCallParksAsPaid(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	b := setupDB(t, shopDBOpts, &atomicphase.Config{FaultInjector: atomicphase.FaultInjectorFunc(
		func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			switch {
			case at.Phase != "charge":
			case at.Place == atomicphase.AfterForeign && n.Add(1) == 1:
				return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
			case at.Place == atomicphase.BeforePhase && n.Load() == 1:
				return atomicphase.Permanent(errors.New("the takeover fails at the start"))
			}
			return nil
		})})
	var mu sync.Mutex
	wf := chargeOnly(&mu, map[string]int{})
	_, err := b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	_, err = b.runner.Run(b.ctx, wf, buyRequest("k", 1, 1))
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Parked)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, info.Unsettled, "the first attempt may have charged")
}
