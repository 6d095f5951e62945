package transfers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transfer is the workflow's state.
type Transfer struct {
	Account  int64  `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	IBAN     string `json:"iban"`

	ID      int64  `json:"id,omitempty"`
	BankRef string `json:"bank_ref,omitempty"`
	Refused string `json:"refused,omitempty"`
}

// Service holds the pool and the queries built on it, for what runs
// outside the phases (the balance endpoint), and the bank's client.
type Service struct {
	pool   *pgxpool.Pool
	q      *Queries
	bank   *http.Client
	bankAt string
}

func NewService(pool *pgxpool.Pool, bankAt string) *Service {
	return &Service{pool: pool, q: New(pool), bank: &http.Client{}, bankAt: bankAt}
}

// Balance is a read outside any workflow: the pool is the right handle.
func (s *Service) Balance(ctx context.Context, account int64) (int64, error) {
	return s.q.Balance(ctx, account)
}

func (s *Service) Phases() []atomicphase.Phase[Transfer] {
	return []atomicphase.Phase[Transfer]{
		atomicphase.Local("hold", s.hold),
		atomicphase.Foreign("send", s.send, s.recordSent).WithReconcile(s.lookup),
		atomicphase.Local("respond", func(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
			if t.Refused != "" {
				if err := s.q.WithTx(tx).ReleaseHold(ctx, t.Account, t.Amount); err != nil {
					return atomicphase.Outcome{}, err
				}
				body, err := json.Marshal(map[string]any{"error": t.Refused})
				return atomicphase.Respond(http.StatusUnprocessableEntity, body), err
			}
			body, err := json.Marshal(t)
			return atomicphase.Respond(http.StatusCreated, body), err
		}),
	}
}

// hold takes the funds and records the transfer, through the phase's tx.
func (s *Service) hold(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
	q := s.q.WithTx(tx)
	if _, err := q.HoldFunds(ctx, t.Account, t.Amount); err != nil {
		return atomicphase.Outcome{}, fmt.Errorf("hold: %w", err)
	}
	id, err := q.CreateTransfer(ctx, t.Account, t.Amount, t.Currency)
	t.ID = id
	return atomicphase.Continue(), err
}

// send makes the one call, with the downstream key as the bank's
// Idempotency-Key.
func (s *Service) send(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) error {
	return call.Do(ctx, func(ctx context.Context, key string) error {
		body, err := json.Marshal(map[string]any{"amount": t.Amount, "currency": t.Currency, "iban": t.IBAN})
		if err != nil {
			return atomicphase.Permanent(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.bankAt+"/transfers", bytes.NewReader(body))
		if err != nil {
			return atomicphase.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.bank.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusUnprocessableEntity:
			t.Refused = "the bank refused the transfer"
			return nil
		case resp.StatusCode != http.StatusCreated:
			return fmt.Errorf("bank: %s", resp.Status)
		}
		var out struct{ ID string }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return err
		}
		t.BankRef = out.ID
		return nil
	})
}

// lookup asks the bank whether a transfer with the key was made: outside
// call.Do, as a reconcile function's lookup is.
func (s *Service) lookup(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) (bool, error) {
	resp, err := s.bank.Get(s.bankAt + "/transfers?idempotency_key=" + url.QueryEscape(call.Key()))
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
	t.BankRef = out.Data[0].ID
	return true, nil
}

func (s *Service) recordSent(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
	if t.Refused != "" {
		return atomicphase.Continue(), nil
	}
	return atomicphase.Continue(), New(tx).RecordSent(ctx, t.ID, t.BankRef)
}
