package transfers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

type Transfer struct {
	Account  int64
	To       int64
	Amount   int64
	Currency string
	IBAN     string
	Hook     string

	ID      int64
	Fee     int64
	BankRef string
}

type Service struct {
	pool   *pgxpool.Pool
	q      *Queries
	bank   *http.Client
	bankAt string
}

func NewService(pool *pgxpool.Pool, bankAt string) *Service {
	return &Service{pool: pool, q: New(pool), bank: &http.Client{}, bankAt: bankAt}
}

func (s *Service) Phases() []atomicphase.Phase[Transfer] {
	return []atomicphase.Phase[Transfer]{
		// The queries built on the pool at start-up, not q.WithTx(tx): the
		// hold commits on its own, and a retry holds the funds twice.
		atomicphase.Local("hold", func(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
			if _, err := s.q.HoldFunds(ctx, t.Account, t.Amount); err != nil { // want `s.q \(a \*transfers.Queries built on a database handle, not on tx\)`
				return atomicphase.Outcome{}, err
			}
			id, err := s.q.WithTx(tx).CreateTransfer(ctx, t.Account, t.Amount, t.Currency)
			t.ID = id
			return atomicphase.Continue(), err
		}),
		// The audit row through the pool.
		atomicphase.Local("audit", func(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
			_, err := s.pool.Exec(ctx, `INSERT INTO audit (transfer, action) VALUES ($1, 'held')`, t.ID) // want `s.pool \(a \*pgxpool.Pool\) is used in a phase`
			return atomicphase.Continue(), err
		}),
		// The fee and the hold computed side by side, the hold in a
		// goroutine that uses tx.
		atomicphase.Local("fee", func(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
				_, err := s.q.WithTx(tx).HoldFunds(gctx, t.Account, t.Fee)
				return err
			})
			g.Go(func() error {
				t.Fee = t.Amount / 100
				return nil
			})
			return atomicphase.Continue(), g.Wait()
		}),
		// The customer's webhook called inside the transaction.
		atomicphase.Local("webhook", func(ctx context.Context, tx atomicphase.Tx, t *Transfer) (atomicphase.Outcome, error) {
			resp, err := http.Post(t.Hook, "application/json", bytes.NewReader([]byte(`{"status":"held"}`))) // want `http.Post in a local phase`
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Continue(), resp.Body.Close()
		}),
		atomicphase.Foreign("send", s.send, nil),
		atomicphase.Foreign("debit and credit", s.debitAndCredit, nil),
		atomicphase.Foreign("send with a deadline", s.sendWithDeadline, nil),
		atomicphase.Foreign("check first", s.checkFirst, nil),
	}
}

// send logs the key, but the request carries none.
func (s *Service) send(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) error {
	log.Printf("transfer %d: downstream key %s", t.ID, call.Key())
	return call.Do(ctx, func(ctx context.Context, _ string) error {
		body, err := json.Marshal(map[string]any{"amount": t.Amount, "iban": t.IBAN})
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.bankAt+"/transfers", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := s.bank.Do(req) // want `\(\*http.Client\).Do inside call.Do is not given the downstream key`
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
}

// debitAndCredit moves the money with two requests in one call: a retry
// after the debit went out debits again.
func (s *Service) debitAndCredit(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) error {
	return call.Do(ctx, func(ctx context.Context, key string) error {
		if err := s.post(ctx, fmt.Sprintf("/accounts/%d/debit", t.Account), key+"-debit", t.Amount); err != nil {
			return err
		}
		return s.post(ctx, fmt.Sprintf("/accounts/%d/credit", t.To), key+"-credit", t.Amount) // want `a second request inside one call.Do`
	})
}

// sendWithDeadline gives up waiting, but the request goes on.
func (s *Service) sendWithDeadline(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) error {
	return call.Do(ctx, func(ctx context.Context, key string) error {
		done := make(chan error, 1)
		go func() { // want `a request sent from a goroutine inside call.Do`
			done <- s.post(context.Background(), "/transfers", key, t.Amount)
		}()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// checkFirst asks whether the transfer exists before making it: a request
// the guard does not see.
func (s *Service) checkFirst(ctx context.Context, call *atomicphase.ForeignCall, t *Transfer) error {
	resp, err := s.bank.Get(s.bankAt + "/transfers?ref=" + call.Key()) // want `\(\*http.Client\).Get in a foreign phase outside call.Do`
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	return call.Do(ctx, func(ctx context.Context, key string) error {
		return s.post(ctx, "/transfers", key, t.Amount)
	})
}

func (s *Service) post(ctx context.Context, path, key string, amount int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.bankAt+path, bytes.NewReader([]byte(fmt.Sprint(amount))))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := s.bank.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
