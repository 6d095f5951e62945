package faultinject_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/faultinject"
)

func TestMain(m *testing.M) {
	if os.Getenv("FAULTINJECT_CHILD") == "1" {
		os.Exit(childMain())
	}
	os.Exit(atomicphasetest.Main(m))
}

// shopDB adds the business table the shop workflow writes.
var shopDB = &atomicphasetest.Options{
	SetupID: "faultinject-shop-v1",
	Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, `CREATE TABLE orders (
			id        bigserial PRIMARY KEY,
			item      text NOT NULL,
			charge_id text)`)
		return err
	},
}

type order struct {
	Item     string `json:"item"`
	OrderID  int64  `json:"order_id,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
}

// flaw selects a deliberately broken variant of the shop workflow.
type flaw int

const (
	sound        flaw = iota
	randomKey         // sends a fresh idempotency key downstream on every attempt
	outsideGuard      // makes its foreign call inside a local phase, unguarded
	outsideTx         // writes its business row outside the phase transaction
)

// shopWorkflow is create_order → charge (foreign) → confirm.
func shopWorkflow(url string, pool *pgxpool.Pool, f flaw) *atomicphase.Workflow[order] {
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
	return atomicphase.MustWorkflow("shop", []atomicphase.Phase[order]{
		atomicphase.Local("create_order", func(ctx context.Context, tx pgx.Tx, o *order) (atomicphase.Outcome, error) {
			var db interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			} = tx
			if f == outsideTx {
				db = pool // the flaw: an autocommit write, outside the phase
			}
			if err := db.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, o.Item).Scan(&o.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			if f == outsideGuard {
				id, err := charge(ctx, http.DefaultClient, "") // the flaw: no guard, no key
				o.ChargeID = id
				return atomicphase.Continue(), err
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, o *order) error {
			if f == outsideGuard {
				return nil // already charged, unguarded
			}
			key := "" // the guarded transport sets the derived key
			if f == randomKey {
				key = randomHex() // the flaw: a new key on every attempt
			}
			id, err := charge(ctx, &http.Client{Transport: call.Transport(nil), Timeout: 5 * time.Second}, key)
			o.ChargeID = id
			return err
		}, nil),
		atomicphase.Local("confirm", func(ctx context.Context, tx pgx.Tx, o *order) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, o.ChargeID, o.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body, err := json.Marshal(o)
			return atomicphase.Respond(201, body), err
		}),
	}, nil)
}

func shopRequest() atomicphase.Request {
	return atomicphase.Request{Scope: "customer_1", Key: "order-123", Method: "POST", Path: "/orders",
		Params: []byte(`{"item":"rocket boots"}`)}
}

// shopScenario explores one request of the shop workflow (with flaw f).
func shopScenario(f flaw) faultinject.Scenario {
	return faultinject.Scenario{
		Name:   "shop",
		DB:     shopDB,
		Config: &atomicphase.Config{RetryBackoff: time.Millisecond},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *faultinject.Trial {
			down := newDownstream(t)
			wf := shopWorkflow(down.URL, db.Pool, f)
			return &faultinject.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, shopRequest())
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					return checkShop(ctx, db.Pool, down, final.Body)
				},
				Close: func() { _ = down.Close() },
			}
		},
	}
}

// checkShop asserts the invariants that matter: exactly one distinct
// effect at the downstream, exactly one business row recording it, and a
// response that names that row and that charge.
func checkShop(ctx context.Context, pool *pgxpool.Pool, down *fakestripe.Server, body []byte) error {
	charges := down.Charges()
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
		return fmt.Errorf("%d order rows, %d of them with the charge; want exactly 1 with it", rows, id)
	}
	var resp order
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("response %q: %w", body, err)
	}
	if resp.OrderID != id || resp.ChargeID != charge {
		return fmt.Errorf("response %s names order %d and charge %q; the database has order %d with %s", body, resp.OrderID, resp.ChargeID, id, charge)
	}
	return nil
}

// newDownstream starts the fake payment API, which deduplicates by
// Idempotency-Key like Stripe and counts distinct charges; a request without
// a key is a new charge every time.
func newDownstream(t testing.TB) *fakestripe.Server {
	t.Helper()
	d, err := fakestripe.Start()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
