// Package suppressed holds findings suppressed with //apvet:ignore, and
// suppressions that are wrong.
package suppressed

import (
	"context"
	"net/http"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Ride struct{ ID int64 }

func Phases(pool *pgxpool.Pool, base string) []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("a mutant, on the line above", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			//apvet:ignore handle the explorer's test plants this write outside the phase on purpose
			_, err := pool.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`)
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("a mutant, at the end of the line", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			_, err := http.Post(base, "text/plain", nil) //apvet:ignore local-io,handle a planted mistake
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("the wrong rule", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			//apvet:ignore local-io the rule is not the finding's // want `this //apvet:ignore local-io suppresses no finding: remove it`
			_, err := pool.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`) // want `pool \(a \*pgxpool.Pool\) is used in a phase`
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("left behind", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			//apvet:ignore handle the write moved to tx long ago // want `this //apvet:ignore handle suppresses no finding`
			_, err := tx.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`)
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("malformed", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			// want +1 `//apvet:ignore handle gives no reason: say why the finding is wrong here`
			//apvet:ignore handle
			_, err := pool.Exec(ctx, `SELECT 1`) // want `pool \(a \*pgxpool.Pool\)`
			// want +1 `//apvet:ignore names the unknown rule "pool"`
			//apvet:ignore pool it is fine
			_, err = pool.Exec(ctx, `SELECT 2`)
			return atomicphase.Continue(), err
		}),
	}
}
