package app

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

type booked struct {
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
}

func decodeBooked(t *testing.T, r reply) booked {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var out booked
	require.NoError(t, json.Unmarshal(r.body, &out))
	return out
}

// TestSweepFinishesARequestWhoseClientGaveUp: an attempt dies after the
// charge and its client never retries; once the lock is stale the sweep
// resumes the key, records the charge (the payment API's deduplication
// keeps it one), queues the receipt and stores the 201 the client would
// have got.
func TestSweepFinishesARequestWhoseClientGaveUp(t *testing.T) {
	t.Parallel()
	// Long enough for the first sweep to come before the lock goes stale,
	// on a loaded machine or a Citus cluster too.
	const lockTimeout = time.Second
	crash := faultinject.New(faultinject.Rule{Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Crash})
	b := setup(t, &setupOpts{runner: &atomicphase.Config{LockTimeout: lockTimeout, FaultInjector: crash}})

	gaveUp := b.post(t, "user@example.com", "abandoned", rideBody)
	require.GreaterOrEqual(t, gaveUp.status, 500, "%s", gaveUp.body)
	require.Len(t, b.fake.Charges(), 1, "charged before the crash")

	sweeper, err := atomicphase.NewSweeper(b.runner, nil)
	require.NoError(t, err)
	res, err := sweeper.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Completed, "a lock younger than the lock timeout is left alone")
	// Once the lock is stale, a sweep finds the key: the sweep after the
	// one whose watermark passes it (on Citus, whose workers stamp keys
	// with their own clocks, a second later).
	completed := 0
	require.Eventually(t, func() bool {
		res, err := sweeper.RunOnce(context.Background())
		require.NoError(t, err)
		completed += res.Completed
		return completed > 0
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 1, completed)

	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM idempotency_keys WHERE response_status = 201"))
	require.Len(t, b.fake.Charges(), 1, "the resumed charge reused the downstream key")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides WHERE stripe_charge_id = $1", b.fake.Charges()[0].ID))
	receipts := b.waitReceipts(t, 1)
	require.Equal(t, b.fake.Charges()[0].ID, receipts[0].ChargeID)

	replay := b.post(t, "user@example.com", "abandoned", rideBody)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	got := decodeBooked(t, replay)
	require.Equal(t, receipts[0].RideID, got.RideID)
	require.Equal(t, receipts[0].ChargeID, got.ChargeID)
}

// TestSweepReapsAndTheKeyIsThenANewRequest: a finished key past its
// retention is deleted; the same key then books a new ride with a new
// charge under a new downstream key, and a second receipt.
func TestSweepReapsAndTheKeyIsThenANewRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := decodeBooked(t, b.post(t, "user@example.com", "reused", rideBody))

	sweeper, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{Retention: time.Millisecond})
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	res, err := sweeper.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.Reaped)
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))

	again := b.post(t, "user@example.com", "reused", rideBody)
	require.Empty(t, again.header.Get("Idempotent-Replayed"), "a new request, not a replay")
	second := decodeBooked(t, again)
	require.NotEqual(t, first.RideID, second.RideID)
	require.NotEqual(t, first.ChargeID, second.ChargeID)
	charges := b.fake.Charges()
	require.Len(t, charges, 2)
	require.NotEqual(t, charges[0].IdempotencyKey, charges[1].IdempotencyKey)
	require.Len(t, b.waitReceipts(t, 2), 2)
}
