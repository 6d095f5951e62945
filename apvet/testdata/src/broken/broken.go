// Package broken holds the workflow mistakes apvet must flag, one per
// phase.
package broken

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/atomicphase/atomicphase"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Ride struct {
	ID   int64
	Ref  string
	Name string
}

type app struct {
	pool *pgxpool.Pool
	db   *sql.DB
}

func (a *app) Phases(base string) []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("pool", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := a.pool.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`) // want `a.pool \(a \*pgxpool.Pool\) is used in a phase instead of its transaction tx: what it writes there commits on its own`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("sqldb", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := a.db.ExecContext(ctx, `INSERT INTO rides DEFAULT VALUES`) // want `a.db \(a \*sql.DB\) is used in a phase instead of its transaction tx`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("beginfunc", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			err := pgx.BeginFunc(ctx, tx.Conn(), func(inner pgx.Tx) error { // want `pgx.BeginFunc on a connection in a phase begins and commits a transaction of its own`
				_, err := inner.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`)
				return err
			})
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("conn begin", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			inner, err := tx.Conn().Begin(ctx) // want `Begin on a connection in a phase begins a transaction of its own`
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Continue(), inner.Commit(ctx)
		}),
		atomicphase.Local("sql commit", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO rides DEFAULT VALUES`)
			_, err := tx.Exec(ctx, `COMMIT`) // want `"COMMIT" in a phase is transaction control: it would end the phase's transaction`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("sql commit on conn", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := tx.Conn().Exec(ctx, `INSERT INTO rides DEFAULT VALUES; COMMIT; BEGIN`) // want `"COMMIT" in a phase is transaction control`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("network", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := http.Post(base+"/charges", "text/plain", nil) // want `http.Post in a local phase: network I/O inside the phase's transaction`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("helper", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), charge(ctx, base, "k") // want `charge \(which calls \(\*http.Client\).Do\) in a local phase`
		}),
		atomicphase.Local("goroutine", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			go tx.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`) // want `a goroutine in a phase uses the phase's transaction`
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("outside do", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			if _, err := http.Get(base + "/ping"); err != nil { // want `http.Get in a foreign phase outside call.Do: the guard does not see it`
				return err
			}
			return call.Do(ctx, func(ctx context.Context, key string) error {
				return charge(ctx, base, key)
			})
		}, nil),
		atomicphase.Foreign("two calls", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			if err := call.Do(ctx, func(ctx context.Context, key string) error { return charge(ctx, base, key) }); err != nil {
				return err
			}
			return call.Do(ctx, func(ctx context.Context, key string) error { return charge(ctx, base, key) }) // want `a second call.Do on the same path of a foreign phase`
		}, nil),
		atomicphase.Foreign("loop", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			for range 3 {
				if err := call.Do(ctx, func(ctx context.Context, key string) error { return charge(ctx, base, key) }); err == nil { // want `call.Do in a loop`
					return nil
				}
			}
			return nil
		}, nil),
		atomicphase.Foreign("key ignored", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, _ string) error {
				return charge(ctx, base, "fresh-key") // want `charge \(which calls \(\*http.Client\).Do\) inside call.Do is not given the downstream key`
			})
		}, nil),
		atomicphase.Foreign("retrying client", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				req, _ := retryablehttp.NewRequest("POST", base+"/payouts?ref="+key, nil)
				_, err := retryablehttp.NewClient().Do(req) // want `github.com/hashicorp/go-retryablehttp retries requests on its own`
				return err
			})
		}, nil),
		atomicphase.Foreign("pool in a call", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			_, err := a.pool.Exec(ctx, `INSERT INTO calls DEFAULT VALUES`) // want `a.pool \(a \*pgxpool.Pool\) is used in a phase that makes a foreign call: a foreign phase holds no transaction`
			return err
		}, nil),
	}
}

var lastTx atomicphase.Tx

// keepTx keeps its transaction for later.
func keepTx(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	lastTx = tx // want `the phase's transaction \(tx\) is stored where it outlives the phase`
	local := tx
	_ = local
	return atomicphase.Continue(), nil
}

// recordRide is a phase function declared on its own, and found by its
// signature all the same.
func recordRide(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	var pool *pgxpool.Pool = globalPool                          // want `globalPool \(a \*pgxpool.Pool\) is used in a phase`
	_, err := pool.Exec(ctx, `UPDATE rides SET recorded = true`) // want `pool \(a \*pgxpool.Pool\) is used in a phase`
	return atomicphase.Continue(), err
}

var globalPool *pgxpool.Pool

func charge(ctx context.Context, base, key string) error {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/charges", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	_, err = http.DefaultClient.Do(req)
	return err
}
