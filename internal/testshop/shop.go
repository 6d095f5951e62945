// Package testshop is the workflow the faultinject and atomicphasetest
// tests run under faults: create_order → charge (a foreign call to the fake
// payment API) → confirm, in a sound variant and in three deliberately
// broken ones the explorer must catch; and "payout" (payout.go), the same
// shape paying through a bank without idempotency keys, reconciled or (the
// broken variant) not. It is test fixture code, imported by
// tests only.
package testshop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// SetupID names what Setup creates, for atomicphasetest.Options.
const SetupID = "testshop-orders-v1"

// Setup adds the business table the workflow writes.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE orders (
		id        bigserial PRIMARY KEY,
		item      text NOT NULL,
		charge_id text)`)
	return err
}

// OrderInput is what an order request carries.
type OrderInput struct {
	Item string `json:"item"`
}

// Order is the workflow's state.
type Order struct {
	Item     string `json:"item"`
	OrderID  int64  `json:"order_id,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
}

// Flaw selects a deliberately broken variant of the workflow.
type Flaw int

// The variants.
const (
	// Sound is the correct workflow.
	Sound Flaw = iota
	// RandomKey makes its call through ForeignCall.Do but ignores the key
	// it is handed, sending a fresh one on every attempt.
	RandomKey
	// OutsideGuard makes its foreign call inside a local phase, unguarded.
	OutsideGuard
	// OutsideTx writes its business row outside the phase transaction.
	OutsideTx
	// AssumingNew is sound, not flawed: the workflow sets
	// WorkflowOpts.AssumeNewKeys and create_order queues its insert (with
	// an order id of its own choosing), so that a new key's read rides in
	// the first unit's batch.
	AssumingNew
)

// Workflow is "shop": create_order → charge (foreign, at the payment API at
// url) → confirm, broken as f says.
func Workflow(url string, pool *pgxpool.Pool, f Flaw) *atomicphase.Workflow[Order] {
	charge := func(ctx context.Context, client *http.Client, key string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/charges", strings.NewReader("amount=2000&currency=usd&customer=cus_1"))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("payment API answered %s", resp.Status)
		}
		var ch struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&ch)
		return ch.ID, err
	}
	start := func(in OrderInput, _ *atomicphase.Request) (Order, error) {
		return Order{Item: in.Item}, nil
	}
	return atomicphase.MustWorkflow("shop", start, []atomicphase.Phase[Order]{
		atomicphase.Local("create_order", func(ctx context.Context, tx atomicphase.Tx, o *Order) (atomicphase.Outcome, error) {
			var db interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			} = tx
			if f == OutsideTx {
				db = pool // the flaw: an autocommit write, outside the phase
			}
			if f == AssumingNew {
				// Far above the serial's ids; a new one on every run of the
				// phase, whose earlier runs rolled back.
				b := make([]byte, 5)
				_, _ = rand.Read(b)
				o.OrderID = 1<<50 + int64(b[0])<<32 | int64(b[1])<<24 | int64(b[2])<<16 | int64(b[3])<<8 | int64(b[4])
				tx.Queue(`INSERT INTO orders (id, item) VALUES ($1, $2)`, o.OrderID, o.Item)
				return atomicphase.Continue(), nil
			}
			if err := db.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, o.Item).Scan(&o.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			if f == OutsideGuard {
				id, err := charge(ctx, http.DefaultClient, "") // the flaw: no guard, no key
				o.ChargeID = id
				return atomicphase.Continue(), err
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, o *Order) error {
			if f == OutsideGuard {
				return nil // already charged, unguarded
			}
			if f == RandomKey {
				return call.Do(ctx, func(ctx context.Context, _ string) error {
					id, err := charge(ctx, http.DefaultClient, randomHex()) // the flaw: a new key on every attempt
					o.ChargeID = id
					return err
				})
			}
			// The guarded transport sets the derived key.
			id, err := charge(ctx, &http.Client{Transport: call.Transport(nil), Timeout: 5 * time.Second}, "")
			o.ChargeID = id
			return err
		}, nil),
		atomicphase.Local("confirm", func(ctx context.Context, tx atomicphase.Tx, o *Order) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, o.ChargeID, o.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body, err := json.Marshal(o)
			return atomicphase.Respond(201, body), err
		}),
	}, &atomicphase.WorkflowOpts{AssumeNewKeys: f == AssumingNew})
}

// Request is the one request the tests send.
func Request() atomicphase.Request {
	return atomicphase.Request{Scope: "customer_1", Key: "order-123", Method: "POST", Path: "/orders",
		Params: []byte(`{"item":"rocket boots"}`)}
}

// Check asserts the invariants that matter: exactly one distinct effect at
// the payment API, exactly one business row recording it, and a response
// body that names that row and that charge.
func Check(ctx context.Context, pool *pgxpool.Pool, payments *fakestripe.Server, body []byte) error {
	charges := payments.Charges()
	if len(charges) != 1 {
		return fmt.Errorf("%d distinct charges at the downstream, want 1", len(charges))
	}
	charge := charges[0].ID
	var rows int
	var id int64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(id) FILTER (WHERE charge_id = $1), 0) FROM orders`, charge).Scan(&rows, &id); err != nil {
		return err
	}
	if rows != 1 || id == 0 {
		return fmt.Errorf("%d order rows (id of the one with the charge: %d); want exactly 1, with the charge", rows, id)
	}
	var resp Order
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("response %q: %w", body, err)
	}
	if resp.OrderID != id || resp.ChargeID != charge {
		return fmt.Errorf("response %s names order %d and charge %q; the database has order %d with %s", body, resp.OrderID, resp.ChargeID, id, charge)
	}
	return nil
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
