package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// TestQuickstartSurvivesEveryFault explores the quickstart workflow at
// every fault point × action. Run with -v to see the table.
func TestQuickstartSurvivesEveryFault(t *testing.T) {
	sc := atomicphasetest.Scenario{
		Name: "quickstart create_order",
		DB: &atomicphasetest.Options{
			SetupID: "quickstart-orders-v1",
			Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
				_, err := pool.Exec(ctx, `CREATE TABLE quickstart_orders (
					id bigserial PRIMARY KEY, item text NOT NULL, amount int NOT NULL, charge_id text)`)
				return err
			},
		},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			payments, err := fakestripe.Start()
			if err != nil {
				t.Fatal(err)
			}
			wf := newOrderWorkflow(payments.URL)
			return &atomicphasetest.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, atomicphase.Request{Scope: "customer_42", Key: "order-a",
						Method: "POST", Path: "/orders", Params: []byte(`{"item": "rocket boots", "amount": 2000}`)})
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					charges := payments.Charges()
					if len(charges) != 1 {
						return fmt.Errorf("%d distinct charges; want 1", len(charges))
					}
					var orders int
					if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM quickstart_orders WHERE charge_id = $1`, charges[0].ID).Scan(&orders); err != nil {
						return err
					}
					if orders != 1 {
						return fmt.Errorf("%d orders record the charge; want 1", orders)
					}
					return nil
				},
				Close: func() { _ = payments.Close() },
			}
		},
	}
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	atomicphasetest.Explore(t, sc)
}
