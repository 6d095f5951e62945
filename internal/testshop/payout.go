package testshop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

// Bank is a downstream without idempotency keys, as a legacy payout API
// is: every call it takes effect on is a payout, whatever reference it
// carries. It counts payouts per reference, answers lookups by reference,
// and remembers any reference paid twice. It can be told to make its first
// call's outcome unknown to the caller.
type Bank struct {
	// First is what happens to the first payout call: "" (paid and
	// answered), BankActThenLose (paid, the answer lost) or
	// BankRefuseThenLose (not paid, and answered with an error all the
	// same, as a 5xx that did not execute is).
	First string

	mu      sync.Mutex
	calls   int
	payouts map[string][]string // reference → payout ids
	twice   []string            // references paid more than once
	acks    map[string]int      // reference → acknowledgements
}

// The Bank.First modes.
const (
	BankActThenLose    = "act-then-lose"
	BankRefuseThenLose = "refuse-then-lose"
)

// NewBank returns a bank that pays and answers every call (then First
// applies to its first call).
func NewBank() *Bank { return &Bank{payouts: map[string][]string{}, acks: map[string]int{}} }

// Ack acknowledges the payout made with ref, as a legacy "confirm receipt"
// endpoint does: every call is an effect of its own.
func (b *Bank) Ack(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.acks[ref]++
}

// Pay makes a payout for ref, or fails as First says on the first call.
func (b *Bank) Pay(ref string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.calls == 1 && b.First == BankRefuseThenLose {
		return "", errors.New("bank: 503, nothing paid")
	}
	id := fmt.Sprintf("po_%d", b.calls)
	b.payouts[ref] = append(b.payouts[ref], id)
	if len(b.payouts[ref]) == 2 {
		b.twice = append(b.twice, ref)
	}
	if b.calls == 1 && b.First == BankActThenLose {
		return "", errors.New("bank: connection reset after the payout was made")
	}
	return id, nil
}

// Lookup lists the payouts made with ref.
func (b *Bank) Lookup(ref string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.payouts[ref]...)
}

// CheckPayouts asserts at most one payout per reference (at any time: a
// reference paid twice stays reported), and, once the request finished,
// exactly one payout in all, the one the response names and the order row
// records.
func (b *Bank) CheckPayouts(ctx context.Context, pool *pgxpool.Pool, body []byte) error {
	b.mu.Lock()
	twice := append([]string(nil), b.twice...)
	var all []string
	for _, ids := range b.payouts {
		all = append(all, ids...)
	}
	acks := map[string]int{}
	for ref, n := range b.acks {
		acks[ref] = n
	}
	b.mu.Unlock()
	for ref, n := range acks {
		if n > 1 {
			return fmt.Errorf("%d acknowledgements for reference %s at the bank, want at most 1", n, ref)
		}
	}
	if len(twice) > 0 {
		return fmt.Errorf("%d effects for reference %s at the bank, want at most 1", len(b.Lookup(twice[0])), twice[0])
	}
	if len(all) != 1 {
		return fmt.Errorf("%d effects at the bank once finished, want exactly 1", len(all))
	}
	var resp Order
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("response %q: %w", body, err)
	}
	if resp.ChargeID != all[0] {
		return fmt.Errorf("response %s names payout %q; the bank made %s", body, resp.ChargeID, all[0])
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE charge_id = $1`, all[0]).Scan(&rows); err != nil {
		return err
	}
	if rows != 1 {
		return fmt.Errorf("%d order rows record payout %s, want 1", rows, all[0])
	}
	return nil
}

// Reconciliation is how PayoutWorkflow's pay phase learns whether an
// earlier attempt paid.
type Reconciliation int

// The reconciliations.
const (
	// NoReconcile declares the non-idempotent call as if the bank
	// deduplicated by key, which it does not: the broken variant the
	// explorer must catch.
	NoReconcile Reconciliation = iota
	// Reconcile looks the reference up: the sound variant.
	Reconcile
	// ReconcileAndAck looks the reference up and, finding the payout,
	// acknowledges it at the bank: a side effect in the reconcile function,
	// repeated by every attempt that reconciles. Only an attempt after the
	// first reconciles, so only a fault on a later attempt shows it.
	ReconcileAndAck
)

// PayoutWorkflow is PayoutWorkflowWith(bank, Reconcile) when reconcile is
// true, NoReconcile when false.
func PayoutWorkflow(bank *Bank, reconcile bool) *atomicphase.Workflow[Order] {
	if reconcile {
		return PayoutWorkflowWith(bank, Reconcile)
	}
	return PayoutWorkflowWith(bank, NoReconcile)
}

// PayoutWorkflowWith is "payout": create_order → pay (a foreign call to bank,
// with the downstream key as the payout's reference; the payout id goes in
// Order.ChargeID) → confirm, pay reconciled as rec says.
func PayoutWorkflowWith(bank *Bank, rec Reconciliation) *atomicphase.Workflow[Order] {
	start := func(in OrderInput, _ *atomicphase.Request) (Order, error) {
		return Order{Item: in.Item}, nil
	}
	pay := atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, o *Order) error {
		return call.Do(ctx, func(ctx context.Context, ref string) error {
			id, err := bank.Pay(ref)
			o.ChargeID = id
			return err
		})
	}, nil)
	if rec != NoReconcile {
		pay = pay.WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, o *Order) (bool, error) {
			ids := bank.Lookup(call.Key())
			if len(ids) == 0 {
				return false, nil
			}
			if rec == ReconcileAndAck {
				bank.Ack(call.Key())
			}
			o.ChargeID = ids[0]
			return true, nil
		})
	}
	return atomicphase.MustWorkflow("payout", start, []atomicphase.Phase[Order]{
		atomicphase.Local("create_order", func(ctx context.Context, tx atomicphase.Tx, o *Order) (atomicphase.Outcome, error) {
			err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, o.Item).Scan(&o.OrderID)
			return atomicphase.Continue(), err
		}),
		pay,
		atomicphase.Local("confirm", func(ctx context.Context, tx atomicphase.Tx, o *Order) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, o.ChargeID, o.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body, err := json.Marshal(o)
			return atomicphase.Respond(201, body), err
		}),
	}, nil)
}
