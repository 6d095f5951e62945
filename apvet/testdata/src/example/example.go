// Package example is the workflow apvet's package example checks.
package example

import (
	"context"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Ride struct{ ID int64 }

func Phases(pool *pgxpool.Pool) []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			err := pool.QueryRow(ctx, `INSERT INTO rides DEFAULT VALUES RETURNING id`).Scan(&r.ID)
			return atomicphase.Continue(), err
		}),
	}
}
