package app

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// TestReceiptCommitsAndRollsBackWithThePhase: the receipt job is written
// through the last phase's transaction. At that phase's before-commit point
// the phase's own connection sees the job and every other connection does
// not; when the phase fails there, the job is gone with the rest of it; the
// retry that commits leaves exactly one job and one receipt.
func TestReceiptCommitsAndRollsBackWithThePhase(t *testing.T) {
	t.Parallel()
	type counts struct{ inside, outside int }
	var (
		outsider atomic.Pointer[pgxpool.Pool]
		mu       sync.Mutex
		seen     []counts
	)
	inj := atomicphase.FaultInjectorFunc(func(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
		if at.Phase != "send_receipt" || at.Place != atomicphase.BeforeCommit {
			return nil
		}
		var c counts
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM receipt_outbox").Scan(&c.inside); err != nil {
			return err
		}
		if err := outsider.Load().QueryRow(ctx, "SELECT count(*) FROM receipt_outbox").Scan(&c.outside); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, c)
		if len(seen) == 1 {
			return errors.New("injected: the last phase fails after queuing the receipt")
		}
		return nil
	})
	b := setup(t, &setupOpts{runner: &atomicphase.Config{FaultInjector: inj}})
	outsider.Store(b.db.Pool)

	failed := b.post(t, "user@example.com", "k", rideBody)
	require.GreaterOrEqual(t, failed.status, 500, "%s", failed.body)
	require.Zero(t, b.queuedReceipts(t), "the receipt rolled back with the phase")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'payout'"))

	ok := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, http.StatusCreated, ok.status, "%s", ok.body)
	require.Equal(t, 1, b.queuedReceipts(t), "the receipt committed with the phase")
	mu.Lock()
	require.Equal(t, []counts{{1, 0}, {1, 0}}, seen, "inside the phase's transaction, and only there, before it commits")
	mu.Unlock()
	require.Len(t, b.waitReceipts(t, 1), 1)
	time.Sleep(300 * time.Millisecond)
	require.Len(t, b.mailer.Receipts(), 1, "the rolled-back job sent nothing")
}

// TestReceiptRetriedUntilTheMailerTakesIt: 5xx answers are retried, with the
// same Idempotency-Key every time, quickly enough for the 10 seconds.
func TestReceiptRetriedUntilTheMailerTakesIt(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.mailer.FailNext(3)
	start := time.Now()
	require.Equal(t, http.StatusCreated, b.post(t, "user@example.com", "k", rideBody).status)
	receipts := b.waitReceipts(t, 1)
	t.Logf("delivered %s after the 201, at the fourth attempt", receipts[0].At.Sub(start).Round(time.Millisecond))
	attempts := b.mailer.Attempts()
	require.Len(t, attempts, 4)
	for i, a := range attempts {
		require.Equal(t, receipts[0].Key, a.Key, "attempt %d carries the receipt's key", i+1)
		want := http.StatusServiceUnavailable
		if i == 3 {
			want = http.StatusOK
		}
		require.Equal(t, want, a.Status)
	}
	require.Eventually(t, func() bool {
		return b.count(t, "SELECT count(*) FROM river_job WHERE state = 'completed' AND attempt = 4") == 1
	}, time.Minute, 20*time.Millisecond)
}

// TestReceiptLeftRunningByADeadProcessIsRescued: a receipt job left
// "running" by a process that died is made available again and delivered
// within seconds (River's own rescuer would wait for leadership and its
// 30-second tick); one out of attempts is discarded; one that has run for
// less than a delivery may take is left alone.
func TestReceiptLeftRunningByADeadProcessIsRescued(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	insert := func(attempt int, attemptedAgo time.Duration, key string) int64 {
		var id int64
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
			INSERT INTO river_job (state, attempt, max_attempts, attempted_at, attempted_by, args, kind)
			VALUES ('running', $1, $2, now() - $3::interval, '{dead-process}', $4, 'ride_receipt') RETURNING id`,
			attempt, receiptMaxAttempts, attemptedAgo.String(),
			ReceiptArgs{To: "user@example.com", RideID: 7, ChargeID: "ch_7", Key: key}).Scan(&id))
		return id
	}
	stuck := insert(1, time.Minute, "k-stuck")
	spent := insert(receiptMaxAttempts, time.Minute, "k-spent")
	fresh := insert(1, 0, "k-fresh")

	receipts := b.waitReceipts(t, 1)
	require.Equal(t, "k-stuck", receipts[0].Key)
	state := func(id int64) (s string) {
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT state FROM river_job WHERE id = $1", id).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return state(stuck) == "completed" }, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, "discarded", state(spent))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM river_job WHERE id = $1 AND finalized_at IS NOT NULL AND cardinality(errors) = 1", spent))
	require.Equal(t, "running", state(fresh), "running for less than %s: not rescued", rescueAfter)
	for _, a := range b.mailer.Attempts() {
		require.Equal(t, "k-stuck", a.Key)
	}
}

// TestReceiptRefusedByTheMailerIsCancelled: a 4xx is no transient failure;
// the job is cancelled at once, with the mailer's answer kept as its error.
func TestReceiptRefusedByTheMailerIsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	res, err := b.receipts.client.Insert(context.Background(), ReceiptArgs{RideID: 9, ChargeID: "ch_9", Key: "k-no-recipient"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.count(t, "SELECT count(*) FROM river_job WHERE id = $1 AND state = 'cancelled'", res.Job.ID) == 1
	}, 5*time.Second, 20*time.Millisecond)
	require.Len(t, b.mailer.Attempts(), 1)
	require.Equal(t, http.StatusUnprocessableEntity, b.mailer.Attempts()[0].Status)
}

func TestReceiptBackoff(t *testing.T) {
	t.Parallel()
	var firstFive time.Duration
	for n := 1; n <= receiptMaxAttempts; n++ {
		d := receiptBackoff(n)
		ceiling := min(retryBase<<min(n-1, 10), retryCap)
		if n > fastRetries {
			ceiling = slowRetry
		}
		require.GreaterOrEqual(t, d, ceiling/2, "attempt %d", n)
		require.LessOrEqual(t, d, ceiling, "attempt %d", n)
		if n <= 5 {
			firstFive += ceiling
		}
	}
	require.Less(t, firstFive, 8*time.Second, "five failed deliveries still leave the receipt inside 10 seconds")
}
