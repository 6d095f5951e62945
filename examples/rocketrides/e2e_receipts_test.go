package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEveryBookedRideGetsOneReceipt books rides through two SIGKILLs (one
// right after the receipt was queued and before the 201 went out, one while
// a delivery was in flight at the mailer) and mailer 5xx answers, plus a
// declined ride; then every booked ride has exactly one receipt at the
// mailer, under a key of its own, delivered within 10 seconds of its 201,
// and the decline none.
func TestEveryBookedRideGetsOneReceipt(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const user = "user@example.com"
	w.mailer.FailNext(2)
	rides := map[int64]booked{}
	answeredAt := map[int64]time.Time{}
	book := func(url, key string) {
		t.Helper()
		b := decodeBooked(t, retryUntilFinal(t, url, user, key, rideBody))
		if _, ok := rides[b.RideID]; !ok {
			rides[b.RideID], answeredAt[b.RideID] = b, time.Now()
		}
	}

	// Killed right after the last phase committed: the receipt is queued,
	// the 201 never went out; the retry gets it from the next process.
	first := w.start(t, "ATOMICPHASE_FAULTS=create_ride/send_receipt:after-commit:exit")
	_, err := post(first.url, user, "r1", rideBody)
	require.Error(t, err, "the server died mid-request")
	<-first.exited
	second := w.start(t)
	book(second.url, "r1")
	book(second.url, "r2")
	book(second.url, "r3")
	declined := retryUntilFinal(t, second.url, "user-bad-source@example.com", "d1", rideBody)
	require.Equal(t, http.StatusPaymentRequired, declined.status)
	w.waitReceipts(t, 3)

	// Killed while the mailer holds a delivery: the job is left running,
	// and the next process must not wait for River's slow rescue.
	before := len(w.mailer.Attempts())
	w.mailer.HangNext(1)
	book(second.url, "r4")
	require.Eventually(t, func() bool { return len(w.mailer.Attempts()) > before }, time.Minute, 10*time.Millisecond)
	require.NoError(t, second.cmd.Process.Kill())
	<-second.exited
	third := w.start(t)
	book(third.url, "r5")

	w.waitReceipts(t, len(rides))
	time.Sleep(500 * time.Millisecond) // room for a late duplicate to show
	receipts := w.mailer.Receipts()
	require.Len(t, receipts, 5)
	keys := map[string]bool{}
	for _, r := range receipts {
		ride, ok := rides[r.RideID]
		require.True(t, ok, "receipt %s for ride %d, which is not one of the booked rides (or has two receipts)", r.ID, r.RideID)
		delete(rides, r.RideID)
		require.Equal(t, user, r.To)
		require.Equal(t, ride.ChargeID, r.ChargeID)
		require.False(t, keys[r.Key], "receipt keys are distinct")
		keys[r.Key] = true
		late := r.At.Sub(answeredAt[r.RideID])
		require.LessOrEqual(t, late, 10*time.Second, "ride %d's receipt came %s after its 201", r.RideID, late)
		t.Logf("ride %d: receipt %s, %s after the 201", r.RideID, r.ID, late.Round(time.Millisecond))
	}
	require.Empty(t, rides, "every booked ride has its receipt")
	attempts := w.mailer.Attempts()
	for _, a := range attempts {
		require.True(t, keys[a.Key], "every delivery attempt, failed and hung ones included, carried its receipt's key")
	}
	require.Greater(t, len(attempts), 5+2, "the 503s and the hung delivery were retried")
}
