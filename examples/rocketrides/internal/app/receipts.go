package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// Receipts are a transactional outbox, delivered by River. The booking's
// last phase adds the ride's receipt to receipt_outbox through the phase's
// own transaction, so the receipt exists exactly when the ride's final state
// (and the stored 201) does. A relay hands each queued receipt to River as a
// job, unique by the receipt's key, and only then removes it from the
// outbox; River's workers deliver it to the mailer API, at least once,
// retrying with a short backoff, and the mailer deduplicates by the
// Idempotency-Key the receipt carries. The outbox is a table of the
// example's own, keyed by rider like the rides, so on Citus it is
// distributed with them and the last phase commits on one worker; River's
// tables stay on the coordinator, written only by the relay.

// The delivery's timing. River rescues a job left running by a killed
// process only after its leader (re-elected up to 15s after a kill) runs its
// rescuer (every 30s), which would break the contract's "within 10 seconds of
// the 201"; so Receipts rescues its own jobs, every rescueTick, once they have
// run for longer than rescueAfter.
const (
	deliveryTimeout = 3 * time.Second // the mailer call, River's job timeout
	rescueAfter     = deliveryTimeout + time.Second
	rescueTick      = time.Second
	fetchPoll       = 500 * time.Millisecond // how soon a due retry is picked up
	relayTick       = 200 * time.Millisecond // how soon a queued receipt is handed to River
	relayBatch      = 100

	// A failed delivery is retried after 250ms, doubling up to 4s, for
	// about a minute and a half; then every few minutes, for about ten hours
	// in all; then River discards the job (state discarded, with its
	// errors, for an operator).
	retryBase          = 250 * time.Millisecond
	retryCap           = 4 * time.Second // below River's scheduler interval: the job stays "available"
	fastRetries        = 30
	slowRetry          = 5 * time.Minute
	receiptMaxAttempts = 180
	receiptKeyPrefix   = "rocketrides-receipt-"
)

// ReceiptArgs is the receipt job: what the mailer is sent, and the
// Idempotency-Key every delivery attempt carries.
type ReceiptArgs struct {
	To       string `json:"to"`
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
	// Key is chosen when the receipt is queued and stored with it, so every
	// delivery attempt of this receipt sends the same one. It is random
	// rather than derived from the ride: ride ids restart in every
	// database, and two databases may share one mailer. The job is unique
	// by it: a receipt the relay hands over twice is one job.
	Key string `json:"key" river:"unique"`
}

// Kind is the job kind in river_job.
func (ReceiptArgs) Kind() string { return "ride_receipt" }

// InsertOpts gives receipts their own attempt budget.
func (ReceiptArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: receiptMaxAttempts, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// Receipts delivers ride receipts: River's client, which both takes the
// booking's InsertTx and runs the workers, and the rescuer of receipts left
// running by a killed process.
type Receipts struct {
	client *river.Client[pgx.Tx]
	pool   *pgxpool.Pool
	logf   func(string, ...any)
	stop   context.CancelFunc
	done   chan struct{}
}

// StartReceipts starts delivering the receipts queued in pool's database
// (River's schema must be there: see Migrate) to the mailer API at
// mailerBase. River logs to logger; deliveries are reported through logf.
// Stop it with Stop.
func StartReceipts(pool *pgxpool.Pool, mailerBase string, logger *slog.Logger, logf func(string, ...any)) (*Receipts, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &receiptWorker{
		base:   mailerBase,
		client: &http.Client{Timeout: deliveryTimeout},
		logf:   logf,
	})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:              workers,
		JobTimeout:           deliveryTimeout,
		RescueStuckJobsAfter: rescueAfter,
		FetchPollInterval:    fetchPoll,
		Logger:               logger,
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	// River's own context is not the caller's: Stop drains it gracefully
	// instead of cancelling deliveries in flight.
	if err := client.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("start river: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Receipts{client: client, pool: pool, logf: logf, stop: stop, done: make(chan struct{})}
	go r.loop(ctx)
	return r, nil
}

// Stop stops fetching receipts and waits, until ctx ends, for deliveries in
// flight; after that it cancels them (River retries them on the next start).
func (r *Receipts) Stop(ctx context.Context) error {
	r.stop()
	<-r.done
	err := r.client.Stop(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = r.client.StopAndCancel(cctx)
	}
	return err
}

// Enqueue queues the receipt for ride in tx, the booking phase's
// transaction: it commits, and reaches the relay, exactly when the phase
// does, and rolls back with it.
func (r *Receipts) Enqueue(ctx context.Context, tx pgx.Tx, ride *Ride) error {
	_, err := tx.Exec(ctx, `INSERT INTO receipt_outbox (rider, ride_id, recipient, charge_id, key)
		VALUES ($1, $2, $3, $4, $5)`, ride.Email, ride.RideID, ride.Email, ride.ChargeID, receiptKeyPrefix+rand.Text())
	if err != nil {
		return fmt.Errorf("queue the receipt: %w", err)
	}
	return nil
}

// QueuedReceipts counts the receipts queued, in the outbox or as River
// jobs, each once. It reads the outbox first, then the jobs: the relay
// inserts a job before it deletes the receipt from the outbox, so a receipt
// it moves in between is still counted. (One statement reading both would
// not do on Citus, which reads a distributed and a local table apart.)
func QueuedReceipts(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (int, error) {
	keys := map[string]bool{}
	for _, sql := range []string{
		`SELECT key FROM receipt_outbox`,
		`SELECT args->>'key' FROM river_job WHERE kind = 'ride_receipt'`,
	} {
		rows, err := db.Query(ctx, sql)
		if err != nil {
			return 0, err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, err
		}
		for _, k := range got {
			keys[k] = true
		}
	}
	return len(keys), nil
}

// relaySQL reads the oldest queued receipts; on Citus, from every shard.
const relaySQL = `SELECT rider, ride_id, recipient, charge_id, key FROM receipt_outbox
ORDER BY queued_at LIMIT $1`

// relay hands the queued receipts to River, each as a job unique by its
// key, then removes it from the outbox. A process that dies between the two
// leaves it queued: the next relay hands it over again, and River keeps
// the one job (or, once that job is gone, the mailer keeps one receipt per
// key). Relays in several processes may hand the same receipt over at
// once, to the same effect.
func (r *Receipts) relay(ctx context.Context) (int, error) {
	rows, err := r.pool.Query(ctx, relaySQL, relayBatch)
	if err != nil {
		return 0, err
	}
	type queued struct {
		rider string
		args  ReceiptArgs
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queued, error) {
		var q queued
		return q, row.Scan(&q.rider, &q.args.RideID, &q.args.To, &q.args.ChargeID, &q.args.Key)
	})
	if err != nil {
		return 0, err
	}
	for i, q := range batch {
		if _, err := r.client.Insert(ctx, q.args, nil); err != nil {
			return i, fmt.Errorf("hand the receipt for ride %d to River: %w", q.args.RideID, err)
		}
		if _, err := r.pool.Exec(ctx, `DELETE FROM receipt_outbox WHERE rider = $1 AND ride_id = $2`,
			q.rider, q.args.RideID); err != nil {
			return i, err
		}
	}
	return len(batch), nil
}

// rescueSQL makes receipts that have been running for longer than a
// delivery may take available again (or discards one out of attempts),
// as River's own rescuer does: a single statement, so a job that finished
// meanwhile is left alone. A job rescued from a process that is in fact
// alive is delivered twice, and the mailer keeps one.
const rescueSQL = `
UPDATE river_job SET
    state = CASE WHEN attempt >= max_attempts THEN 'discarded' ELSE 'available' END::river_job_state,
    finalized_at = CASE WHEN attempt >= max_attempts THEN now() END,
    scheduled_at = now(),
    errors = array_append(errors, jsonb_build_object(
        'at', now(), 'attempt', attempt, 'trace', '',
        'error', 'rescued: still running after ' || $2::text || ', its process presumably died'))
WHERE kind = $1 AND state = 'running' AND attempted_at < now() - $2::interval`

// loop relays queued receipts every relayTick and rescues receipts left
// running every rescueTick, until ctx ends.
func (r *Receipts) loop(ctx context.Context) {
	defer close(r.done)
	relay := time.NewTicker(relayTick)
	defer relay.Stop()
	rescue := time.NewTicker(rescueTick)
	defer rescue.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-relay.C:
			if _, err := r.relay(ctx); err != nil && ctx.Err() == nil {
				r.logf("relaying receipts: %v", err)
			}
		case <-rescue.C:
			tag, err := r.pool.Exec(ctx, rescueSQL, ReceiptArgs{}.Kind(), rescueAfter.String())
			switch {
			case err != nil && ctx.Err() == nil:
				r.logf("rescuing receipts: %v", err)
			case err == nil && tag.RowsAffected() > 0:
				r.logf("rescued %d receipt(s) left running by a process that died", tag.RowsAffected())
			}
		}
	}
}

// receiptWorker sends one receipt to the mailer API.
type receiptWorker struct {
	river.WorkerDefaults[ReceiptArgs]
	base   string
	client *http.Client
	logf   func(string, ...any)
}

// Work posts the receipt. A 2xx is delivered; a connection error, a 5xx, a
// 408 or a 429 is retried; any other answer is a refusal no retry changes,
// so the job is cancelled (kept in river_job, with the error, for an
// operator).
func (w *receiptWorker) Work(ctx context.Context, job *river.Job[ReceiptArgs]) error {
	a := job.Args
	body, err := json.Marshal(map[string]any{"to": a.To, "ride_id": a.RideID, "charge_id": a.ChargeID})
	if err != nil {
		return river.JobCancel(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return river.JobCancel(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", a.Key)
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("receipt for ride %d: %w", a.RideID, err)
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		w.logf("receipt for ride %d delivered to %s (attempt %d)", a.RideID, a.To, job.Attempt)
		return nil
	case s >= 500, s == http.StatusRequestTimeout, s == http.StatusTooManyRequests:
		return fmt.Errorf("receipt for ride %d: the mailer answered %d: %s", a.RideID, s, answer)
	default:
		w.logf("the mailer refused the receipt for ride %d with %d: %s", a.RideID, s, answer)
		return river.JobCancel(fmt.Errorf("receipt for ride %d: the mailer refused it with %d: %s", a.RideID, s, answer))
	}
}

// NextRetry is receiptBackoff after the failed attempt.
func (w *receiptWorker) NextRetry(job *river.Job[ReceiptArgs]) time.Time {
	return time.Now().Add(receiptBackoff(job.Attempt))
}

// receiptBackoff is the rest after failed attempt n (from 1): retryBase
// doubled per attempt up to retryCap, jittered down by up to half so that
// receipts failing together do not return together; slowRetry once the fast
// retries are spent.
func receiptBackoff(n int) time.Duration {
	d := retryCap
	switch shift := max(n-1, 0); {
	case n > fastRetries:
		d = slowRetry
	case shift < 5:
		d = min(retryBase<<shift, retryCap)
	}
	return d/2 + mrand.N(d/2+1)
}
