// Package good is a sound workflow: apvet reports nothing in it.
package good

import (
	"context"
	"database/sql"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Ride struct {
	ID       int64
	ChargeID string
}

// Phases wires the workflow; the pool is used outside any phase.
func Phases(pool *pgxpool.Pool, db *sql.DB, base string) []atomicphase.Phase[Ride] {
	_, _ = pool.Exec(context.Background(), "SELECT 1") // not in a phase
	_ = db
	client := &http.Client{}
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			if err := tx.QueryRow(ctx, `INSERT INTO rides DEFAULT VALUES RETURNING id`).Scan(&r.ID); err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(`INSERT INTO audit (note) VALUES ('a; COMMIT')`) // in a string literal
			conn := tx.Conn()                                         // inside the transaction
			if _, err := conn.Exec(ctx, `UPDATE rides SET note = 'x'`); err != nil {
				return atomicphase.Outcome{}, err
			}
			sp, err := tx.Begin(ctx) // a savepoint
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			_, _ = sp.Exec(ctx, `ROLLBACK TO SAVEPOINT x`)
			return atomicphase.Continue(), sp.Commit(ctx)
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			if r.ChargeID != "" {
				return call.Do(ctx, func(ctx context.Context, key string) error {
					req, _ := http.NewRequestWithContext(ctx, "POST", base+"/refund", strings.NewReader(key))
					_, err := client.Do(req)
					return err
				})
			}
			return call.Do(ctx, func(ctx context.Context, key string) error {
				req, _ := http.NewRequestWithContext(ctx, "POST", base+"/charges", nil)
				req.Header.Set("Idempotency-Key", key)
				_, err := client.Do(req)
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			tx.Queue(`UPDATE rides SET charge_id = $1`, r.ChargeID)
			return atomicphase.Continue(), nil
		}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) (bool, error) {
			// The lookup is made outside call.Do, by design.
			resp, err := client.Get(base + "/charges?key=" + call.Key())
			return resp != nil, err
		}),
		atomicphase.Foreign("notify", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			// Every request through call.Transport is guarded.
			c := &http.Client{Transport: call.Transport(nil)}
			_, err := c.Post(base+"/notify", "text/plain", nil)
			return err
		}, nil),
	}
}
