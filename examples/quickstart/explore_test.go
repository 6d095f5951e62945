package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
)

// TestQuickstartSurvivesEveryFault explores the quickstart workflow at
// every fault point × action. Run with -v to see the table.
func TestQuickstartSurvivesEveryFault(t *testing.T) {
	sc := faultinject.Scenario{
		Name: "quickstart create_order",
		DB: &atomicphasetest.Options{
			SetupID: "quickstart-orders-v1",
			Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
				_, err := pool.Exec(ctx, `CREATE TABLE quickstart_orders (
					id bigserial PRIMARY KEY, item text NOT NULL, amount int NOT NULL, charge_id text)`)
				return err
			},
		},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *faultinject.Trial {
			payments := newPaymentAPI()
			wf := newOrderWorkflow(payments.URL)
			return &faultinject.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, atomicphase.Request{Scope: "customer_42", Key: "order-a",
						Method: "POST", Path: "/orders", Params: []byte(`{"item": "rocket boots", "amount": 2000}`)})
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					var orders int
					if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM quickstart_orders WHERE charge_id = 'ch_1'`).Scan(&orders); err != nil {
						return err
					}
					if payments.Charges() != 1 || orders != 1 {
						return fmt.Errorf("%d distinct charges and %d charged orders; want 1 and 1", payments.Charges(), orders)
					}
					return nil
				},
				Close: payments.Close,
			}
		},
	}
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	faultinject.Explore(t, sc)
}
