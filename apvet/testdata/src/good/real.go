package good

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sync"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// DBTX, New, Queries and WithTx are what sqlc generates.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func New(db DBTX) *Queries { return &Queries{db: db} }

type Queries struct{ db DBTX }

func (q *Queries) WithTx(tx pgx.Tx) *Queries { return &Queries{db: tx} }

func (q *Queries) CreateRide(ctx context.Context) (int64, error) {
	var id int64
	err := q.db.QueryRow(ctx, `INSERT INTO rides DEFAULT VALUES RETURNING id`).Scan(&id)
	return id, err
}

type service struct {
	q      *Queries
	client *http.Client
	base   string
}

var lastErr error

// guarded builds the client whose requests call.Transport guards.
func guarded(call *atomicphase.ForeignCall) *http.Client {
	return &http.Client{Transport: call.Transport(nil)}
}

// reference is the key a downstream without keys looks a payout up by.
func reference(call *atomicphase.ForeignCall) string { return call.Key() }

func (s *service) Phases() []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("sqlc on tx", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			id, err := s.q.WithTx(tx).CreateRide(ctx)
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			q := s.q.WithTx(tx)
			if _, err := q.CreateRide(ctx); err != nil {
				return atomicphase.Outcome{}, err
			}
			_, err = New(tx).CreateRide(ctx)
			r.ID = id
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("batch", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			b := &pgx.Batch{}
			b.Queue(`UPDATE accounts SET balance = balance - $1 WHERE id = $2`, 100, 1)
			b.Queue(`UPDATE accounts SET balance = balance + $1 WHERE id = $2`, 100, 2)
			br := tx.SendBatch(ctx, b)
			for range b.Len() {
				if _, err := br.Exec(); err != nil {
					_ = br.Close()
					return atomicphase.Outcome{}, err
				}
			}
			return atomicphase.Continue(), br.Close()
		}),
		atomicphase.Local("an error kept", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `UPDATE rides SET note = 'x'`)
			lastErr = err // an error, not the transaction
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("goroutines without tx", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			var g errgroup.Group
			var wg sync.WaitGroup
			sums := make([]int, 2)
			g.Go(func() error { sums[0] = 1; return nil })
			wg.Go(func() { sums[1] = 2 })
			wg.Wait()
			if err := g.Wait(); err != nil {
				return atomicphase.Outcome{}, err
			}
			_, err := tx.Exec(ctx, `UPDATE rides SET total = $1`, sums[0]+sums[1])
			return atomicphase.Continue(), err
		}),
		// A helper given call builds the guarded client: its requests are
		// guarded wherever they are sent.
		atomicphase.Foreign("guarded helper", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			c := guarded(call)
			_, err := c.Post(s.base+"/notify", "text/plain", nil)
			return err
		}, nil),
		// The key reaches the request through a helper given call, in the
		// body (a downstream without keys, looked up by reference).
		atomicphase.Foreign("reference", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, _ string) error {
				body, err := json.Marshal(map[string]any{"reference": reference(call), "amount": 100})
				if err != nil {
					return err
				}
				req, err := http.NewRequestWithContext(ctx, "POST", s.base+"/payouts", bytes.NewReader(body))
				if err != nil {
					return err
				}
				_, err = s.client.Do(req)
				return err
			})
		}, nil),
		// The key in the query string, built with url.Values.
		atomicphase.Foreign("query", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				v := url.Values{}
				v.Set("ref", key)
				_, err := s.client.Post(s.base+"/payouts?"+v.Encode(), "text/plain", nil)
				return err
			})
		}, nil),
		// The key taken before Do, sent through a method helper.
		atomicphase.Foreign("method helper", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			ref := call.Key()
			return call.Do(ctx, func(ctx context.Context, _ string) error {
				return s.send(ctx, "/charges", ref)
			})
		}, nil),
	}
}

func (s *service) send(ctx context.Context, path, key string) error {
	req, err := http.NewRequestWithContext(ctx, "POST", s.base+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
