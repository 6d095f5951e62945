// Package ledger writes double-entry postings with pgx.Batch inside the
// phases, fans pure computation out to goroutines that never touch tx, and
// uses savepoints: apvet reports nothing in it.
package ledger

import (
	"context"
	"errors"
	"sync"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

type Posting struct {
	Debit, Credit int64
	Amount        int64
	Lines         []Line
	Total         int64
	Entry         int64
}

type Line struct {
	Account int64
	Amount  int64
}

type Books struct {
	pool *pgxpool.Pool
}

// Reconcile runs nightly, outside any workflow, on the pool.
func (b *Books) Reconcile(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `SELECT ledger_reconcile()`)
	return err
}

func (b *Books) Phases() []atomicphase.Phase[Posting] {
	return []atomicphase.Phase[Posting]{
		atomicphase.Local("validate", validate),
		atomicphase.Local("post", post),
		atomicphase.Local("lines", lines),
	}
}

// validate sums the lines in goroutines of their own: they compute, and
// never touch tx.
func validate(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
	var g errgroup.Group
	sums := make([]int64, 2)
	half := len(p.Lines) / 2
	for i, part := range [][]Line{p.Lines[:half], p.Lines[half:]} {
		g.Go(func() error {
			for _, l := range part {
				sums[i] += l.Amount
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return atomicphase.Outcome{}, err
	}
	if sums[0]+sums[1] != 0 {
		return atomicphase.Outcome{}, errors.New("the lines do not balance")
	}
	p.Total = sums[0]
	return atomicphase.Continue(), nil
}

// post writes both sides of the entry in one round trip.
func post(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
	batch := &pgx.Batch{}
	batch.Queue(`UPDATE accounts SET balance = balance - $2 WHERE id = $1`, p.Debit, p.Amount)
	batch.Queue(`UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Credit, p.Amount)
	batch.Queue(`INSERT INTO entries (debit, credit, amount) VALUES ($1, $2, $3) RETURNING id`, p.Debit, p.Credit, p.Amount)
	results := tx.SendBatch(ctx, batch)
	defer results.Close()
	for range 2 {
		if _, err := results.Exec(); err != nil {
			return atomicphase.Outcome{}, err
		}
	}
	if err := results.QueryRow().Scan(&p.Entry); err != nil {
		return atomicphase.Outcome{}, err
	}
	return atomicphase.Continue(), results.Close()
}

// lines writes each line in a savepoint of its own, on the phase's
// connection, and counts the written lines under a mutex.
func lines(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
	var mu sync.Mutex
	written := 0
	conn := tx.Conn()
	for _, l := range p.Lines {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return atomicphase.Outcome{}, err
		}
		if _, err := conn.Exec(ctx, `INSERT INTO lines (entry, account, amount) VALUES ($1, $2, $3)`, p.Entry, l.Account, l.Amount); err != nil {
			_ = sp.Rollback(ctx)
			continue
		}
		if err := sp.Commit(ctx); err != nil {
			return atomicphase.Outcome{}, err
		}
		mu.Lock()
		written++
		mu.Unlock()
	}
	tx.Queue(`UPDATE entries SET lines = $2 WHERE id = $1`, p.Entry, written)
	return atomicphase.Continue(), nil
}
