package atomicphasetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/faultinject"
)

type payment struct {
	ChargeID string `json:"charge_id,omitempty"`
}

// newCheckout charges at the payment API (a foreign phase: no transaction
// open during the call, the derived key on it), then records the charge.
func newCheckout(paymentsURL string) *atomicphase.Workflow[payment] {
	start := func(struct{}, *atomicphase.Request) (payment, error) { return payment{}, nil } // no input
	return atomicphase.MustWorkflow("checkout", start, []atomicphase.Phase[payment]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, p *payment) error {
			client := &http.Client{Transport: call.Transport(nil), Timeout: 5 * time.Second}
			resp, err := client.Post(paymentsURL+"/v1/charges", "application/x-www-form-urlencoded",
				strings.NewReader("amount=2000&currency=usd&customer=cus_1"))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("payment API answered %s", resp.Status)
			}
			var ch struct{ ID string }
			err = json.NewDecoder(resp.Body).Decode(&ch)
			p.ChargeID = ch.ID
			return err
		}, nil),
		atomicphase.Local("record", func(ctx context.Context, tx atomicphase.Tx, p *payment) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO payments (charge_id) VALUES ($1)`, p.ChargeID); err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Respond(201, []byte(`{"paid":true}`)), nil
		}),
	}, nil)
}

// A test runs an exploration with Explore(t, scenario), which also fails
// the test on a violation; Survey returns the report instead. Both take
// the test's testing.TB, which an Example function has not: exampleTB
// stands in for it.
func ExampleSurvey() {
	sc := atomicphasetest.Scenario{
		Name: "checkout",
		DB: &atomicphasetest.Options{SetupID: "example-payments-v1", Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `CREATE TABLE payments (charge_id text NOT NULL)`)
			return err
		}},
		// Two of the actions, to keep the example short; the default is
		// every action a test process survives.
		Actions: []faultinject.Action{faultinject.Crash, faultinject.LoseCommitAck},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			payments, err := fakestripe.Start()
			if err != nil {
				t.Fatal(err)
			}
			checkout := newCheckout(payments.URL)
			return &atomicphasetest.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, checkout, atomicphase.Request{Scope: "user_1", Key: "cart-7", Method: "POST", Path: "/checkout"})
				},
				// The invariant: one charge, recorded once, whatever crashed.
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					var rows int
					if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&rows); err != nil {
						return err
					}
					if charges := len(payments.Charges()); charges != 1 || rows != 1 {
						return fmt.Errorf("%d charges and %d rows; want 1 and 1", charges, rows)
					}
					return nil
				},
				Close: func() { _ = payments.Close() },
			}
		},
	}
	rep := atomicphasetest.Survey(exampleTB{}, sc)
	fmt.Print(rep)
	fmt.Println("violation:", rep.Violation())
	// Output:
	// fault exploration "checkout": 8 points, 17 runs
	// POINT                                                                ACTION           ATTEMPTS  OUTCOME  INVARIANT
	// (none)                                                               -                1         201      ok
	// checkout:before-acquire                                              crash            2         201      ok
	// checkout:before-acquire → checkout:before-acquire@2                  crash → crash    3         201      ok
	// checkout:after-acquire                                               crash            2         201      ok
	// checkout:after-acquire → checkout:after-acquire@2                    crash → crash    3         201      ok
	// checkout:charge:before-phase                                         crash            2         201      ok
	// checkout:charge:before-phase → checkout:charge:before-phase@2        crash → crash    3         201      ok
	// checkout:charge:after-foreign                                        crash            2         201      ok
	// checkout:charge:after-foreign → checkout:charge:after-foreign@2      crash → crash    3         201      ok
	// checkout:record:before-phase                                         crash            2         201      ok
	// checkout:record:before-phase → checkout:record:before-phase@2        crash → crash    3         201      ok
	// checkout:record:before-response                                      crash            2         201      ok
	// checkout:record:before-response → checkout:record:before-response@2  crash → crash    3         201      ok
	// checkout:record:before-commit                                        crash            2         201      ok
	// checkout:record:before-commit → checkout:record:before-commit@2      crash → crash    3         201      ok
	// checkout:record:before-commit                                        lose-commit-ack  2         201      ok
	// checkout:record:after-commit                                         crash            2         201      ok
	// coverage:
	// ATTEMPT      POINTS  ACTIONS  POINTS×ACTIONS  RUN  SKIPPED
	// 1            8       2        16              9    7 (3 no connection held there; 4 no commit follows)
	// consecutive  -       -        -               7    2 (2 the retry does not pass the point again)
	// all                                           16
	// violation: <nil>
}

// exampleTB is the testing.TB an Example function lacks: it panics where a
// test would fail. A test passes its own t instead.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                      {}
func (exampleTB) Log(...any)                   {}
func (exampleTB) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (exampleTB) Error(args ...any)            { panic(fmt.Sprint(args...)) }
func (exampleTB) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
