package broken

import (
	"context"

	"github.com/atomicphase/atomicphase"
	"github.com/jackc/pgx/v5"
)

// DBTX, New, Queries and WithTx are what sqlc generates: queries over an
// interface that a pool, a connection and a transaction all satisfy.
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

// store holds the queries it built on the pool at start-up.
type store struct{ q *Queries }

func (s *store) Phases() []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		atomicphase.Local("sqlc on the pool", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
			id, err := s.q.CreateRide(ctx) // want `s.q \(a \*broken.Queries built on a database handle, not on tx\) is used in a phase instead of its transaction tx: what it writes there commits on its own.*use s.q.WithTx\(tx\)`
			r.ID = id
			return atomicphase.Continue(), err
		}),
		atomicphase.Foreign("sqlc in a call", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			_, err := s.q.CreateRide(ctx) // want `s.q \(a \*broken.Queries built on a database handle\) is used in a phase that makes a foreign call`
			return err
		}, nil),
	}
}
