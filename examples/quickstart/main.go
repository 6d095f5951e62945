// Command quickstart runs a three-phase workflow (record an order, charge it
// at a payment API, confirm it) against a real PostgreSQL: one request, a
// replay, and a request that crashes right after the payment API charged and
// is then resumed without charging twice.
//
//	go run ./examples/quickstart
//
// With DATABASE_URL empty it starts a throwaway PostgreSQL itself.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// order is the workflow's state, committed with every phase.
// orderInput is what a client sends; order is what the phases keep.
type orderInput struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

type order struct {
	Item     string `json:"item"`
	Amount   int    `json:"amount"`
	OrderID  int64  `json:"order_id,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
}

const lockTimeout = 2 * time.Second

// ordersTable is the table the workflow writes.
const ordersTable = `CREATE TABLE IF NOT EXISTS quickstart_orders (
	id bigserial PRIMARY KEY, item text NOT NULL, amount int NOT NULL, charge_id text)`

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run runs the quickstart, printing what happens to out.
func run(ctx context.Context, out io.Writer) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		srv, err := atomicphasetest.StartServer(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
		if err != nil {
			return err
		}
		defer srv.Stop()
		url = srv.URL
	}
	trips := &atomicphasetest.RoundTrips{}
	cfg, err := connstr.Parse(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := atomicphase.Migrate(ctx, pool, nil); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, ordersTable); err != nil {
		return err
	}

	payments, err := fakestripe.Start() // deduplicates by Idempotency-Key, as Stripe does
	if err != nil {
		return err
	}
	defer payments.Close()

	// The crash switch: when armed, the attempt dies right after the
	// payment API answered, before the charge phase commits.
	var crashArmed atomic.Bool
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{
		LockTimeout: lockTimeout,
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			if at.Place == atomicphase.AfterForeign && crashArmed.CompareAndSwap(true, false) {
				return atomicphase.ErrCrashed
			}
			return nil
		}),
	})
	if err != nil {
		return err
	}
	workflow := newOrderWorkflow(payments.URL)
	run := time.Now().UnixNano() // keys unique to this run, should DATABASE_URL be reused
	request := func(key string) atomicphase.Request {
		return atomicphase.Request{Scope: "customer_42", Key: fmt.Sprintf("%s-%d", key, run),
			Method: "POST", Path: "/orders", Params: []byte(`{"item": "rocket boots", "amount": 2000}`)}
	}

	fmt.Fprintln(out, "atomicphase quickstart: create_order → charge (payment API) → confirm")

	trips.Reset()
	resp, err := runner.Run(ctx, workflow, request("order-a"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "1. order-a            → %d %s  (3 phases, %d round trips)\n", resp.Status, resp.Body, trips.Count())

	trips.Reset()
	again, err := runner.Run(ctx, workflow, request("order-a"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "2. order-a again      → %d, replayed=%t, same bytes=%t, no phase ran (%d round trip)\n",
		again.Status, again.Replayed, string(again.Body) == string(resp.Body), trips.Count())
	if !again.Replayed || string(again.Body) != string(resp.Body) {
		return errors.New("invariant violated: the replay differs from the first response")
	}

	crashArmed.Store(true)
	_, err = runner.Run(ctx, workflow, request("order-b"))
	if !errors.Is(err, atomicphase.ErrCrashed) {
		return fmt.Errorf("expected the injected crash, got %v", err)
	}
	fmt.Fprintf(out, "3. order-b            → crashed after the payment API charged, before recording it (charges so far: %d)\n", len(payments.Charges()))

	_, err = runner.Run(ctx, workflow, request("order-b"))
	var busy *atomicphase.InProgressError
	if !errors.As(err, &busy) {
		return fmt.Errorf("expected in-progress, got %v", err)
	}
	fmt.Fprintf(out, "4. order-b retry      → in progress: the dead attempt's lock holds until the %s lock timeout\n", lockTimeout)

	time.Sleep(lockTimeout)
	resp, err = runner.Run(ctx, workflow, request("order-b"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "5. order-b retry      → %d %s  (resumed at the charge phase)\n", resp.Status, resp.Body)

	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM quickstart_orders WHERE charge_id IS NOT NULL AND id IN (
		SELECT (convert_from(response_body, 'UTF8')::jsonb->>'order_id')::bigint
		FROM idempotency_keys WHERE idempotency_key LIKE '%-' || $1)`, fmt.Sprint(run)).Scan(&orders); err != nil {
		return err
	}
	fmt.Fprintf(out, "   payment API: %d charge requests, %d distinct charges · database: %d orders for 2 keys\n",
		payments.Requests(), len(payments.Charges()), orders)
	if len(payments.Charges()) != 2 || orders != 2 {
		return errors.New("invariant violated: expected exactly 2 charges and 2 orders")
	}
	return nil
}

func newOrderWorkflow(paymentsURL string) *atomicphase.Workflow[order] {
	start := func(in orderInput, _ *atomicphase.Request) (order, error) {
		if in.Item == "" || in.Amount <= 0 {
			return order{}, atomicphase.Invalid("an order needs an item and a positive amount")
		}
		return order{Item: in.Item, Amount: in.Amount}, nil
	}
	return atomicphase.MustWorkflow("create_order", start, []atomicphase.Phase[order]{
		atomicphase.Local("create_order", func(ctx context.Context, tx atomicphase.Tx, o *order) (atomicphase.Outcome, error) {
			err := tx.QueryRow(ctx, `INSERT INTO quickstart_orders (item, amount) VALUES ($1, $2) RETURNING id`,
				o.Item, o.Amount).Scan(&o.OrderID)
			return atomicphase.Continue(), err
		}),
		// The foreign phase: no transaction is open during the HTTP call,
		// which carries the derived downstream idempotency key.
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, o *order) error {
			client := &http.Client{Transport: call.Transport(nil), Timeout: 10 * time.Second}
			body := fmt.Sprintf("amount=%d&currency=usd&customer=cus_42&description=order+%d", o.Amount, o.OrderID)
			resp, err := client.Post(paymentsURL+"/v1/charges", "application/x-www-form-urlencoded", strings.NewReader(body))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("payment API answered %s", resp.Status) // transient: retried with the same key
			}
			var ch struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
				return err
			}
			o.ChargeID = ch.ID
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, o *order) (atomicphase.Outcome, error) {
			// Queued: sent with the commit, no round trip of its own.
			tx.Queue(`UPDATE quickstart_orders SET charge_id = $1 WHERE id = $2`, o.ChargeID, o.OrderID)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("confirm", func(ctx context.Context, tx atomicphase.Tx, o *order) (atomicphase.Outcome, error) {
			body, err := json.Marshal(map[string]any{"order_id": o.OrderID, "charge_id": o.ChargeID})
			return atomicphase.Respond(201, body), err
		}),
	}, nil)
}
