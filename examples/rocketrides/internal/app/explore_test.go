package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
	"github.com/atomicphase/atomicphase/faultinject"
)

// The explorer runs the booking workflow — ride, charge, payout through a
// bank without idempotency keys, receipt through the outbox — at every
// fault point × action of every attempt, each on a clean database,
// retrying like a client, and checks after each: one ride, one distinct
// charge, exactly one payout for the ride's reference, one receipt job, all
// naming the same ride. It explores two flows: the bank answering, where the
// clean run takes one attempt; and the bank paying then losing its answer,
// where the clean run takes two (409 outcome-unknown, then a retry that
// reconciles the payout by lookup), so the reconciling attempt's points are
// faulted too.
func TestBookingSurvivesEveryFault(t *testing.T) {
	if testing.Short() {
		t.Skip("explores every fault point; -short skips it")
	}
	for _, c := range []struct {
		name     string
		lost     []fakebank.Failure // the bank's first payouts' failures
		attempts int                // the clean run's
	}{
		{"bank answers", nil, 1},
		{"payout answer lost", []fakebank.Failure{fakebank.ActThen5xx}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := atomicphasetest.Explore(t, bookingScenario(c.name, c.lost))
			require.Len(t, rep.Attempts, c.attempts)
			// The actions of time and the network ran: a call slower than
			// the lease and an answer lost on a dropped connection at both
			// foreign phases, and, where an attempt takes the key by a
			// statement of its own, a lost take answer.
			ran := map[faultinject.Action]map[string]bool{}
			for _, row := range rep.Rows[1:] {
				if len(row.Unfired) == 0 && row.Violation == nil {
					f := row.Faults[len(row.Faults)-1]
					if ran[f.Action] == nil {
						ran[f.Action] = map[string]bool{}
					}
					ran[f.Action][f.Point.Phase] = true
				}
			}
			for _, a := range []faultinject.Action{faultinject.SlowCall, faultinject.DropAfterRequest} {
				require.True(t, ran[a]["charge"] && ran[a]["payout"], "%s at both foreign phases: %v", a, ran[a])
			}
			if c.attempts > 1 {
				require.NotEmpty(t, ran[faultinject.LoseTakeAck], "lose-take-ack at the reconciling attempt's acquisition")
			}
			for _, a := range rep.Coverage.Attempts {
				require.Positive(t, a.Run, "attempt %d is faulted", a.Attempt)
			}
			t.Logf("%d runs, %d fault points\n%s", len(rep.Rows), len(rep.Points), rep.Coverage)
		})
	}
}

// bookingScenario explores one booking, the bank failing its first
// payouts as lost says.
func bookingScenario(name string, lost []fakebank.Failure) atomicphasetest.Scenario {
	sc := atomicphasetest.Scenario{
		Name: "rocketrides create_ride, " + name,
		DB:   dbOptions,
		// The fake bank acts before it answers: once a call returned,
		// nothing of it is in flight, and the retry may reconcile at once
		// (Config.CallGrace; a nanosecond, so no retry meets it).
		Config: &atomicphase.Config{CallGrace: time.Nanosecond},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			payments, err := fakestripe.Start()
			if err != nil {
				t.Fatal(err)
			}
			bank, err := fakebank.Start(nil)
			if err != nil {
				t.Fatal(err)
			}
			bank.FailNext(lost...)
			mailer, err := fakemailer.Start(nil)
			if err != nil {
				t.Fatal(err)
			}
			receipts, err := StartReceipts(db.Pool, mailer.URL, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string, ...any) {})
			if err != nil {
				t.Fatal(err)
			}
			// The calls go through a transport whose connections the
			// explorer can break after the downstream read a request.
			h := faultinject.NewHTTP()
			wf := NewWorkflowOver(payments.URL, bank.URL, receipts, h.Transport(nil))
			return &atomicphasetest.Trial{
				HTTP: h,
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, atomicphase.Request{Scope: "user@example.com", Key: "ride-1",
						Method: "POST", Path: "/rides", Params: []byte(rideBody)})
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					if final.Status != 201 {
						return fmt.Errorf("final answer %d %s; want 201", final.Status, final.Body)
					}
					if n := len(payments.Charges()); n != 1 {
						return fmt.Errorf("%d distinct charges; want 1", n)
					}
					for ref, n := range bank.PerReference() {
						if n != 1 {
							return fmt.Errorf("%d payouts for reference %s; want 1", n, ref)
						}
					}
					if n := len(bank.PerReference()); n != 1 {
						return fmt.Errorf("%d payout references; want 1", n)
					}
					var rides, jobs int
					if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rides`).Scan(&rides); err != nil {
						return err
					}
					jobs, err := QueuedReceipts(ctx, db.Pool)
					if err != nil {
						return err
					}
					if rides != 1 || jobs != 1 {
						return fmt.Errorf("%d rides and %d receipt jobs; want 1 and 1", rides, jobs)
					}
					return nil
				},
				Close: func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_ = receipts.Stop(ctx)
					_ = mailer.Close()
					_ = bank.Close()
					_ = payments.Close()
				},
			}
		},
	}
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	return sc
}

// TestBookingConcurrentDuplicateAtEveryPoint sends the same booking a
// second time, concurrently, while the first stands at each point of each
// attempt: one ride, one charge, one payout, one receipt all the same, and
// the duplicate gets the final answer or an error its client retries.
func TestBookingConcurrentDuplicateAtEveryPoint(t *testing.T) {
	if testing.Short() {
		t.Skip("explores every fault point; -short skips it")
	}
	for _, c := range []struct {
		name string
		lost []fakebank.Failure
	}{
		{"bank answers", nil},
		{"payout answer lost", []fakebank.Failure{fakebank.ActThen5xx}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := atomicphasetest.ExploreDuplicates(t, bookingScenario(c.name, c.lost))
			for _, row := range rep.Rows[1:] {
				require.Empty(t, row.Unfired, "the duplicate was sent at %v", row.Faults)
			}
			t.Logf("%d runs", len(rep.Rows))
		})
	}
}
