package app

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/faultinject"
)

type paid struct {
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
	PayoutID string `json:"payout_id"`
}

// requirePaidOnce checks invariant 4 at the bank for one booked ride: the
// 201 names the one payout the bank made, and the ride row records it.
func (b *bundle) requirePaidOnce(t *testing.T, r reply) paid {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var out paid
	require.NoError(t, json.Unmarshal(r.body, &out))
	payouts := b.bank.Payouts()
	require.Len(t, payouts, 1, "exactly one payout at the bank")
	require.Equal(t, payouts[0].ID, out.PayoutID)
	require.Equal(t, DriverAccount, payouts[0].Account)
	require.EqualValues(t, PayoutAmount, payouts[0].Amount)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides WHERE id = $1 AND bank_payout_id = $2", out.RideID, out.PayoutID))
	return out
}

func requireUnknown(t *testing.T, r reply) {
	t.Helper()
	requireProblem(t, r, http.StatusConflict)
	require.Contains(t, string(r.body), aphttp.ProblemOutcomeUnknown)
	require.NotEmpty(t, r.header.Get("Retry-After"))
}

// TestPayoutMadeOnceAndReplayed: a booked ride pays its driver once, the
// 201 carries the payout id, and a replay calls the bank no more. A
// declined ride pays nothing.
func TestPayoutMadeOnceAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.post(t, "user@example.com", "k", rideBody)
	b.requirePaidOnce(t, first)
	replay := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, first.body, replay.body)
	require.Equal(t, 1, b.bank.Calls())
	require.Zero(t, b.bank.Lookups(), "a fresh attempt needs no lookup")

	require.Equal(t, http.StatusPaymentRequired, b.post(t, "user-bad-source@example.com", "k", rideBody).status)
	require.Len(t, b.bank.Payouts(), 1, "a declined ride pays nothing")
	require.Equal(t, 1, b.bank.Calls())
}

// TestPayoutWhoseAnswerWasLostIsNotSentAgain: the bank pays and then
// answers 5xx, or drops the connection. The request answers 409
// outcome-unknown; the retry looks the reference up, finds the payout,
// records it and finishes, without a second call.
func TestPayoutWhoseAnswerWasLostIsNotSentAgain(t *testing.T) {
	t.Parallel()
	for _, f := range []fakebank.Failure{fakebank.ActThen5xx, fakebank.ActThenDrop} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.bank.FailNext(f)
			requireUnknown(t, b.post(t, "user@example.com", "k", rideBody))
			require.Len(t, b.bank.Payouts(), 1, "the bank acted")
			b.requirePaidOnce(t, b.post(t, "user@example.com", "k", rideBody))
			require.Equal(t, 1, b.bank.Calls(), "the payout was never sent again")
			require.Equal(t, 1, b.bank.Lookups())
		})
	}
}

// TestPayoutNotMadeIsMadeAfterTheLookup: a 5xx without acting is unknown
// too; the lookup finds nothing and the retry pays, once.
func TestPayoutNotMadeIsMadeAfterTheLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.bank.FailNext(fakebank.Refuse5xx)
	requireUnknown(t, b.post(t, "user@example.com", "k", rideBody))
	require.Empty(t, b.bank.Payouts())
	b.requirePaidOnce(t, b.post(t, "user@example.com", "k", rideBody))
	require.Equal(t, 2, b.bank.Calls(), "the failed call and the one the lookup allowed")
}

// TestPayoutLookupDownSendsNothing: while the lookup fails, every retry
// gets 409 and the bank receives no payout call: a retry that reconciles
// gets outcome-unknown, and one that comes before the reconciliation's
// backoff ends gets in-progress, asking the bank nothing (its client then
// waits out the Retry-After: AgeLocks, here). Once the lookup answers, the
// request finishes with the one payout.
func TestPayoutLookupDownSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.bank.FailNext(fakebank.ActThenDrop)
	requireUnknown(t, b.post(t, "user@example.com", "k", rideBody))
	b.bank.LookupDownFor(3)
	for i := range 3 {
		requireUnknown(t, b.post(t, "user@example.com", "k", rideBody))
		held := b.post(t, "user@example.com", "k", rideBody)
		requireProblem(t, held, http.StatusConflict)
		require.Contains(t, string(held.body), aphttp.ProblemInProgress)
		require.Equal(t, i+1, b.bank.Lookups(), "a retry during the backoff asks the bank nothing")
		require.NoError(t, atomicphasetest.AgeLocks(context.Background(), b.db.Pool, time.Minute))
	}
	require.Equal(t, 1, b.bank.Calls(), "no payout call while the outcome was unknown")
	require.Equal(t, 3, b.bank.Lookups())
	b.requirePaidOnce(t, b.post(t, "user@example.com", "k", rideBody))
	require.Equal(t, 1, b.bank.Calls())
}

// TestPayoutRefusedIsAStoredAnswer: a 4xx from the bank is its definitive
// answer (nothing paid), so it is the request's answer too: a 424, stored
// and replayed byte for byte, with no receipt and nothing parked; retries
// send nothing to the bank. Before, the key was parked and the client got
// a 500.
func TestPayoutRefusedIsAStoredAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.bank.FailNext(fakebank.Refuse4xx)
	refused := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, http.StatusFailedDependency, refused.status, "%s", refused.body)
	var answer struct {
		Error struct {
			Type     string `json:"type"`
			RideID   int64  `json:"ride_id"`
			ChargeID string `json:"charge_id"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(refused.body, &answer))
	require.Equal(t, "payout_refused", answer.Error.Type)
	require.NotZero(t, answer.Error.RideID)
	require.NotEmpty(t, answer.Error.ChargeID)
	require.Empty(t, b.bank.Payouts())
	info, err := b.runner.Inspect(context.Background(), "user@example.com", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Zero(t, b.queuedReceipts(t), "no receipt for an unpaid ride")

	for range 3 {
		replay := b.post(t, "user@example.com", "k", rideBody)
		require.Equal(t, http.StatusFailedDependency, replay.status)
		require.Equal(t, refused.body, replay.body)
		require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	}
	require.Equal(t, 1, b.bank.Calls(), "the refusal is not asked for again")
}

// TestPayoutKilledAfterTheCallIsReconciled: the attempt dies right after
// the payout call went out (nothing marks the outcome unknown); the retry
// that takes the stale key over resumes into the payout, looks it up first
// and records the payout made.
func TestPayoutKilledAfterTheCallIsReconciled(t *testing.T) {
	t.Parallel()
	const lockTimeout = 200 * time.Millisecond
	crash := faultinject.New(faultinject.Rule{Phase: "payout", Place: atomicphase.AfterForeign, Action: faultinject.Crash})
	b := setup(t, &setupOpts{runner: &atomicphase.Config{LockTimeout: lockTimeout, FaultInjector: crash}})
	died := b.post(t, "user@example.com", "k", rideBody)
	require.GreaterOrEqual(t, died.status, 500, "%s", died.body)
	require.Len(t, b.bank.Payouts(), 1, "paid before the crash")
	time.Sleep(lockTimeout + 50*time.Millisecond)
	b.requirePaidOnce(t, b.post(t, "user@example.com", "k", rideBody))
	require.Equal(t, 1, b.bank.Calls())
	require.Equal(t, 1, b.bank.Lookups())
}

// TestSweepReconcilesAnUnknownPayout: the bank pays and the answer is lost,
// and the client never retries. The sweep reconciles after the backoff,
// records the payout and finishes the request with its receipt; the client
// that comes back gets the stored 201.
func TestSweepReconcilesAnUnknownPayout(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{runner: &atomicphase.Config{AttemptBackoff: time.Millisecond}})
	b.bank.FailNext(fakebank.ActThen5xx)
	requireUnknown(t, b.post(t, "user@example.com", "k", rideBody))

	sweeper, err := atomicphase.NewSweeper(b.runner, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := sweeper.RunOnce(context.Background())
		require.NoError(t, err)
		return b.count(t, "SELECT count(*) FROM idempotency_keys WHERE response_status = 201") == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, b.bank.Calls(), "the sweep sent no payout")
	require.Len(t, b.waitReceipts(t, 1), 1)

	replay := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	b.requirePaidOnce(t, replay)
}
