// Package payouts pays through a bank without idempotency keys: the call
// sends the downstream key as the payout's reference (through a helper
// handed call), and a reconcile function looks the payout up by it. The
// call waits for its answer under a deadline. apvet reports nothing in it.
package payouts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/atomicphase/atomicphase"
)

type Payout struct {
	Account  string
	Amount   int64
	PayoutID string
}

// Reference is what the bank files a payout under: the downstream key.
func Reference(call *atomicphase.ForeignCall) string { return call.Key() }

type Bank struct {
	base   string
	client *http.Client
}

func (b *Bank) Phase() atomicphase.Phase[Payout] {
	return atomicphase.Foreign("payout", b.pay, b.record).WithReconcile(b.find)
}

func (b *Bank) pay(ctx context.Context, call *atomicphase.ForeignCall, p *Payout) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return call.Do(ctx, func(ctx context.Context, _ string) error {
		var body bytes.Buffer
		if err := json.NewEncoder(&body).Encode(map[string]any{
			"reference": Reference(call), "account": p.Account, "amount": p.Amount,
		}); err != nil {
			return atomicphase.Permanent(err)
		}
		resp, err := b.post(ctx, "/payouts", &body)
		if err != nil {
			return err
		}
		p.PayoutID = resp
		return nil
	})
}

// post sends one request and reads the payout's id from the answer.
func (b *Bank) post(ctx context.Context, path string, body io.Reader) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+path, body)
	if err != nil {
		return "", err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("bank: %s", resp.Status)
	}
	var out struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out.ID, err
}

func (b *Bank) find(ctx context.Context, call *atomicphase.ForeignCall, p *Payout) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/payouts?reference="+Reference(call), nil)
	if err != nil {
		return false, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var out struct{ Data []struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return false, err
	}
	if len(out.Data) == 0 {
		return false, nil
	}
	p.PayoutID = out.Data[0].ID
	return true, nil
}

func (b *Bank) record(ctx context.Context, tx atomicphase.Tx, p *Payout) (atomicphase.Outcome, error) {
	tx.Queue(`UPDATE payouts SET bank_id = $1 WHERE account = $2`, p.PayoutID, p.Account)
	return atomicphase.Continue(), nil
}
