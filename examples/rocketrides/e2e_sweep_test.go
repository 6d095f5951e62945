package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/app"
	"github.com/stretchr/testify/require"
)

// TestSweepFinishesARequestWhoseClientGaveUp: the server is killed right
// after the payment API charged the card and before the charge was
// recorded, and the client never retries. The restarted server's sweep
// finishes the request on its own: the ride with its charge (still one at
// the payment API), the receipt at the mailer and the 201 stored on the
// key, within LOCK_TIMEOUT + 3 × SWEEP_INTERVAL of the crash.
func TestSweepFinishesARequestWhoseClientGaveUp(t *testing.T) {
	t.Parallel()
	const lock, interval = time.Second, 2 * time.Second // LOCK_TIMEOUT (startServer's) and SWEEP_INTERVAL
	w := newWorld(t)
	doomed := w.start(t, "ATOMICPHASE_FAULTS=create_ride/charge:after-foreign:exit")
	_, err := post(doomed.url, "user@example.com", "gave-up", rideBody)
	require.Error(t, err, "the server died mid-request")
	<-doomed.exited
	crashed := time.Now()
	require.Len(t, w.pay.Charges(), 1, "charged before the crash")

	restarted := w.start(t, "SWEEP_INTERVAL="+interval.String())
	var chargeID string
	finished := func() bool {
		ctx := context.Background()
		var status *int
		if w.db.Pool.QueryRow(ctx, `SELECT response_status FROM idempotency_keys WHERE idempotency_key = 'gave-up'`).Scan(&status) != nil || status == nil {
			return false
		}
		if w.db.Pool.QueryRow(ctx, `SELECT stripe_charge_id FROM rides WHERE idempotency_key = 'gave-up' AND stripe_charge_id IS NOT NULL`).Scan(&chargeID) != nil {
			return false
		}
		return len(w.mailer.Receipts()) == 1
	}
	bound := lock + 3*interval
	// The bound is the contract's; a loaded machine may take longer, so
	// the test waits for the condition and reports the time (the bound is
	// a promise about the sweep's schedule, not something a shared CI
	// machine can time).
	require.Eventually(t, finished, bound+time.Minute, 20*time.Millisecond, "not finished, log:\n%s", restarted.log)
	took := time.Since(crashed)
	t.Logf("the sweep finished the request %s after the crash (bound %s)", took.Round(time.Millisecond), bound)

	require.Len(t, w.pay.Charges(), 1, "the sweep's charge reused the downstream key")
	require.Equal(t, w.pay.Charges()[0].ID, chargeID)
	receipt := w.mailer.Receipts()[0]
	require.Equal(t, chargeID, receipt.ChargeID)
	require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM idempotency_keys WHERE response_status = 201"))
	_, redactedKey := app.RedactKey("", "gave-up")
	require.Contains(t, restarted.log.String(), `sweep: finished key "`+redactedKey+`"`)
	require.NotContains(t, restarted.log.String(), "gave-up", "keys are redacted in the log")

	// The client that comes back after all gets the stored answer.
	replay, err := post(restarted.url, "user@example.com", "gave-up", rideBody)
	require.NoError(t, err)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	got := decodeBooked(t, replay)
	require.Equal(t, receipt.RideID, got.RideID)
	require.Equal(t, chargeID, got.ChargeID)
	w.requireOnePayout(t, got)
}

// TestSweepFinishesAPayoutCrashedInFlight: the server is killed right
// after the payout call went out, and the client never retries. The bank
// may still act on that call for CALL_GRACE, so the restarted server's
// sweep reconciles it only after the lease plus the grace (no call while
// another may be in flight),
// then finishes the request with the one payout: within LOCK_TIMEOUT +
// CALL_GRACE + 3 × SWEEP_INTERVAL of the crash (reported, not timed).
func TestSweepFinishesAPayoutCrashedInFlight(t *testing.T) {
	t.Parallel()
	const lock, grace, interval = time.Second, 2 * time.Second, time.Second
	w := newWorld(t)
	doomed := w.start(t, "ATOMICPHASE_FAULTS=payout:after-foreign:exit", "CALL_GRACE="+grace.String())
	_, err := post(doomed.url, "user@example.com", "in-flight", rideBody)
	require.Error(t, err, "the server died mid-request")
	<-doomed.exited
	crashed := time.Now()
	require.Len(t, w.bank.Payouts(), 1, "paid before the kill")

	restarted := w.start(t, "SWEEP_INTERVAL="+interval.String(), "CALL_GRACE="+grace.String())
	finished := func() bool {
		var status *int
		err := w.db.Pool.QueryRow(context.Background(), `SELECT response_status FROM idempotency_keys WHERE idempotency_key = 'in-flight'`).Scan(&status)
		return err == nil && status != nil && len(w.mailer.Receipts()) == 1
	}
	bound := lock + grace + 3*interval
	require.Eventually(t, finished, bound+time.Minute, 20*time.Millisecond, "not finished, log:\n%s", restarted.log)
	t.Logf("the sweep finished the request %s after the crash (bound %s)", time.Since(crashed).Round(time.Millisecond), bound)
	require.Equal(t, 1, w.bank.Calls(), "the payout was never sent again")
	require.GreaterOrEqual(t, w.bank.Lookups(), 1, "it was reconciled")
	replay, err := post(restarted.url, "user@example.com", "in-flight", rideBody)
	require.NoError(t, err)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	w.requireOnePayout(t, decodeBooked(t, replay))
}

// TestKeyRetentionReapsFinishedKeys: with a tiny KEY_RETENTION the sweep
// deletes the finished key; the same key is then a new request, which books
// a new ride with a new, distinct charge (under a new downstream key) and a
// receipt of its own.
func TestKeyRetentionReapsFinishedKeys(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	srv := w.start(t, "SWEEP_INTERVAL=100ms", "KEY_RETENTION=1ms")
	first := decodeBooked(t, retryUntilFinal(t, srv.url, "user@example.com", "short-lived", rideBody))
	require.Eventually(t, func() bool {
		var n int
		err := w.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&n)
		return err == nil && n == 0
	}, time.Minute, 20*time.Millisecond, "the finished key was reaped")
	// The sweep logs the reap after its DELETE commits: a moment after the
	// row is gone, on a loaded machine longer.
	require.Eventually(t, func() bool { return strings.Contains(srv.log.String(), "sweep: deleted 1 finished key(s)") },
		time.Minute, 20*time.Millisecond, "log:\n%s", srv.log)

	again := retryUntilFinal(t, srv.url, "user@example.com", "short-lived", rideBody)
	require.Empty(t, again.header.Get("Idempotent-Replayed"), "a new request, not a replay")
	second := decodeBooked(t, again)
	require.NotEqual(t, first.RideID, second.RideID)
	require.NotEqual(t, first.ChargeID, second.ChargeID)
	charges := w.pay.Charges()
	require.Len(t, charges, 2)
	require.NotEqual(t, charges[0].IdempotencyKey, charges[1].IdempotencyKey, "a new downstream key")
	payouts := w.bank.Payouts()
	require.Len(t, payouts, 2, "a new payout for the new request")
	require.NotEqual(t, payouts[0].Reference, payouts[1].Reference, "under a new reference")
	require.Equal(t, []string{first.PayoutID, second.PayoutID}, []string{payouts[0].ID, payouts[1].ID})
	receipts := w.waitReceipts(t, 2)
	require.Len(t, receipts, 2)
	require.ElementsMatch(t, []int64{first.RideID, second.RideID}, []int64{receipts[0].RideID, receipts[1].RideID})
}
