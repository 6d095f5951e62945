package main

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
)

// requireUnknown checks the answer a request gets while its payout's
// outcome is unknown: 409 outcome-unknown with a Retry-After.
func requireUnknown(t *testing.T, r reply, err error) {
	t.Helper()
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Contains(t, string(r.body), "outcome-unknown")
	secs, _ := strconv.Atoi(r.header.Get("Retry-After"))
	require.Positive(t, secs)
}

// TestPayoutWhoseAnswerWasLost: the bank pays and then answers 5xx, or
// drops the connection. The client gets 409 outcome-unknown; its retries
// end with the ride booked and the one payout recorded, never sent again.
func TestPayoutWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	for _, f := range []fakebank.Failure{fakebank.ActThen5xx, fakebank.ActThenDrop} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			srv := w.start(t)
			w.bank.FailNext(f)
			r, err := post(srv.url, "user@example.com", "lost", rideBody)
			requireUnknown(t, r, err)
			ride := decodeBooked(t, retryUntilFinal(t, srv.url, "user@example.com", "lost", rideBody))
			w.requireOnePayout(t, ride)
			require.Equal(t, 1, w.bank.Calls(), "the payout was sent once")
			require.Len(t, w.waitReceipts(t, 1), 1)
		})
	}
}

// TestPayoutLookupDown: the bank pays and drops the connection, and its
// lookup is down for a while. Every retry meanwhile gets 409 and sends no
// payout: the first reconciles and cannot tell, and those that come before
// the reconciliation's backoff ends are told when to come back, asking the
// bank nothing. Once the lookup answers, the request finishes with the one
// payout.
func TestPayoutLookupDown(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	srv := w.start(t, "SWEEP_INTERVAL=0")
	w.bank.FailNext(fakebank.ActThenDrop)
	w.bank.LookupDownFor(2)
	r, err := post(srv.url, "user@example.com", "dark", rideBody)
	requireUnknown(t, r, err)
	r, err = post(srv.url, "user@example.com", "dark", rideBody)
	requireUnknown(t, r, err)
	for range 3 {
		r, err := post(srv.url, "user@example.com", "dark", rideBody)
		require.NoError(t, err)
		require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
		require.Contains(t, string(r.body), "in-progress", "the reconciliation backs off")
		secs, _ := strconv.Atoi(r.header.Get("Retry-After"))
		require.Positive(t, secs)
	}
	require.Equal(t, 1, w.bank.Calls(), "no payout sent while its outcome was unknown")
	require.Equal(t, 1, w.bank.Lookups(), "retries during the backoff ask the bank nothing")
	ride := decodeBooked(t, retryUntilFinal(t, srv.url, "user@example.com", "dark", rideBody))
	w.requireOnePayout(t, ride)
	require.Equal(t, 1, w.bank.Calls())
}

// TestPayoutKilledAfterTheCall: the server is SIGKILLed right after the
// payout call was sent. The restarted server's retry looks the reference
// up first, finds the payout and records it: one payout, one call.
func TestPayoutKilledAfterTheCall(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	doomed := w.start(t, "ATOMICPHASE_FAULTS=payout:after-foreign:exit")
	_, err := post(doomed.url, "user@example.com", "killed", rideBody)
	require.Error(t, err, "the server died mid-request")
	<-doomed.exited
	require.Len(t, w.bank.Payouts(), 1, "paid before the kill")

	restarted := w.start(t, "SWEEP_INTERVAL=0")
	ride := decodeBooked(t, retryUntilFinal(t, restarted.url, "user@example.com", "killed", rideBody))
	w.requireOnePayout(t, ride)
	require.Equal(t, 1, w.bank.Calls())
	require.Equal(t, 1, w.bank.Lookups())
	require.Len(t, w.waitReceipts(t, 1), 1)
}

// TestSweepReconcilesAnUnknownPayout: the bank pays and answers 5xx, and
// the client never retries. The sweep looks the payout up, records it and
// finishes the request (201 stored, receipt sent) with no second call.
func TestSweepReconcilesAnUnknownPayout(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	srv := w.start(t, "SWEEP_INTERVAL=200ms")
	w.bank.FailNext(fakebank.ActThen5xx)
	r, err := post(srv.url, "user@example.com", "left", rideBody)
	requireUnknown(t, r, err)
	require.Eventually(t, func() bool {
		var n int
		err := w.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'left' AND response_status = 201`).Scan(&n)
		return err == nil && n == 1
	}, 15*time.Second, 20*time.Millisecond, "not finished, log:\n%s", srv.log)
	require.Contains(t, srv.log.String(), "reconciled payout: it took effect")
	require.Equal(t, 1, w.bank.Calls(), "the sweep sent no payout")
	require.Len(t, w.waitReceipts(t, 1), 1)

	replay, err := post(srv.url, "user@example.com", "left", rideBody)
	require.NoError(t, err)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	w.requireOnePayout(t, decodeBooked(t, replay))
}

// TestPayoutSlowerThanTheLockTimeout: the bank takes longer than
// LOCK_TIMEOUT to pay and answer, and the client retries every half lock
// timeout meanwhile. The server renews the key's lease during the call:
// every retry is told 409 until the ride is booked, and the driver is paid
// once.
func TestPayoutSlowerThanTheLockTimeout(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	srv := w.start(t, "CALL_GRACE=15s") // the default
	lock, err := time.ParseDuration(lockTimeout)
	require.NoError(t, err)
	w.bank.SlowDown(5 * lock / 2)
	first := make(chan reply, 1)
	go func() {
		r, err := post(srv.url, "user@example.com", "slow", rideBody)
		if err != nil {
			r.status = 0
		}
		first <- r
	}()
	var final reply
	for range 100 {
		time.Sleep(lock / 2)
		r, err := post(srv.url, "user@example.com", "slow", rideBody)
		require.NoError(t, err)
		if r.status != http.StatusConflict {
			final = r
			break
		}
		require.Contains(t, string(r.body), "in-progress", "a retry while the payout is in flight")
	}
	first201 := (<-first).status == http.StatusCreated
	require.Equal(t, 1, w.bank.Calls(), "the payout was sent once")
	ride := decodeBooked(t, final)
	w.requireOnePayout(t, ride)
	require.True(t, first201, "the first request kept its lease through the slow payout")
}
