// Package ledger is the ledger of corpus/sound/ledger with the mistakes
// its author could make, one per phase: apvet reports each, and nothing
// else.
package ledger

import (
	"context"
	"sync"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Posting struct {
	Debit, Credit int64
	Amount        int64
	Entry         int64
}

type Books struct {
	pool *pgxpool.Pool
	// last is the transaction of the last posting, for the after-commit
	// hook.
	last atomicphase.Tx
}

func (b *Books) Phases() []atomicphase.Phase[Posting] {
	return []atomicphase.Phase[Posting]{
		// Both sides sent on the pool, in a batch of their own.
		atomicphase.Local("post", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			batch := &pgx.Batch{}
			batch.Queue(`UPDATE accounts SET balance = balance - $2 WHERE id = $1`, p.Debit, p.Amount)
			batch.Queue(`UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Credit, p.Amount)
			return atomicphase.Continue(), b.pool.SendBatch(ctx, batch).Close() // want `b.pool \(a \*pgxpool.Pool\) is used in a phase`
		}),
		// A checkpoint that commits the phase's work half way.
		atomicphase.Local("checkpoint", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO entries (debit, credit, amount) VALUES ($1, $2, $3)`, p.Debit, p.Credit, p.Amount); err != nil {
				return atomicphase.Outcome{}, err
			}
			_, err := tx.Exec(ctx, `COMMIT; BEGIN`) // want `"COMMIT" in a phase is transaction control`
			return atomicphase.Continue(), err
		}),
		// A transaction of its own on the phase's connection.
		atomicphase.Local("nested", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			err := pgx.BeginFunc(ctx, tx.Conn(), func(inner pgx.Tx) error { // want `pgx.BeginFunc on a connection in a phase`
				_, err := inner.Exec(ctx, `UPDATE accounts SET frozen = false WHERE id = $1`, p.Debit)
				return err
			})
			return atomicphase.Continue(), err
		}),
		// The transaction kept for a hook that runs after the phase.
		atomicphase.Local("keep", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			b.last = tx // want `the phase's transaction \(tx\) is stored where it outlives the phase`
			return atomicphase.Continue(), nil
		}),
		// A fire-and-forget audit row on the phase's transaction.
		atomicphase.Local("audit", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			go func() { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
				_, _ = tx.Exec(context.Background(), `INSERT INTO audit (entry) VALUES ($1)`, p.Entry)
			}()
			return atomicphase.Continue(), nil
		}),
		// Both sides at once, each in a goroutine.
		atomicphase.Local("parallel", func(ctx context.Context, tx atomicphase.Tx, p *Posting) (atomicphase.Outcome, error) {
			var wg sync.WaitGroup
			for _, side := range []struct{ account, amount int64 }{{p.Debit, -p.Amount}, {p.Credit, p.Amount}} {
				wg.Go(func() { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
					_, _ = tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, side.account, side.amount)
				})
			}
			wg.Wait()
			return atomicphase.Continue(), nil
		}),
	}
}
