package atomicphase_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// BenchmarkLeaseRoundTrips reports what leases cost in round trips per
// request (roundtrips/op): a new key through a workflow whose foreign call
// goes to a downstream with idempotency keys (no mark, no renewal), through
// one without (the call mark: one more), and through one whose call lasts
// longer than the lease (renewals: one per third of the lease).
func BenchmarkLeaseRoundTrips(b *testing.B) {
	for _, tc := range []struct {
		name      string
		reconcile bool
		call      time.Duration
		lease     time.Duration
	}{
		{"idempotent-downstream", false, 0, 0},
		{"reconciled-downstream", true, 0, 0},
		{"call-3x-the-lease", true, 150 * time.Millisecond, 50 * time.Millisecond},
	} {
		b.Run(tc.name, func(b *testing.B) {
			trips := &atomicphasetest.RoundTrips{}
			opts := *testDBOpts
			opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips }
			db := atomicphasetest.NewDB(b, &opts)
			runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{LockTimeout: tc.lease})
			if err != nil {
				b.Fatal(err)
			}
			pay := atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
				return call.Do(ctx, func(ctx context.Context, ref string) error {
					if tc.call > 0 {
						time.Sleep(tc.call)
					}
					p.PayoutID = ref
					return nil
				})
			}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
				return atomicphase.Respond(201, []byte(p.PayoutID)), nil
			})
			if tc.reconcile {
				pay = pay.WithReconcile(func(context.Context, *atomicphase.ForeignCall, *payout) (bool, error) { return false, nil })
			}
			wf := atomicphase.MustWorkflow("bench-"+tc.name, startEmpty[payout], []atomicphase.Phase[payout]{
				atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
					return atomicphase.Continue(), nil
				}),
				pay,
			}, nil)
			ctx := context.Background()
			var seq atomic.Int64
			run := func() {
				req := atomicphase.Request{Scope: "u", Key: fmt.Sprint("k", seq.Add(1)), Method: "POST", Path: "/b"}
				if _, err := runner.Run(ctx, wf, req); err != nil {
					b.Fatal(err)
				}
			}
			run() // statements prepared on the connection
			trips.Reset()
			b.ResetTimer()
			for range b.N {
				run()
			}
			b.StopTimer()
			b.ReportMetric(float64(trips.Count())/float64(b.N), "roundtrips/op")
		})
	}
}
