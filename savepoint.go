package atomicphase

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// savepoint is the pgx.Tx a phase's Tx.Begin returns: a savepoint inside
// the phase's transaction that the phase's queued statements follow.
// Statements queued with Tx.Queue while it is open belong inside it: each
// of its methods first sends whatever the phase queued (so they run in
// order, inside the savepoint), Commit sends them before releasing it, and
// Rollback drops them, as the savepoint's rollback would have undone them.
// Without that, a write queued inside a savepoint that rolled back was sent
// after it, and committed with the phase.
type savepoint struct {
	t  *phaseTx
	sp pgx.Tx
	// done is set once the savepoint was released or rolled back: a
	// deferred Rollback after Commit must leave alone what the phase
	// queued since, outside the savepoint.
	done bool
	// guarded is whether the phase's guard cursor was declared before the
	// savepoint began: one declared inside it goes with its rollback.
	guarded bool
}

var _ pgx.Tx = (*savepoint)(nil)

// ready sends what the phase queued, inside the savepoint, after refusing
// sql when it is transaction control or the transaction escaped.
func (s *savepoint) ready(ctx context.Context, sql string) error {
	if err := s.t.check(sql); err != nil {
		return err
	}
	return s.t.flush(ctx)
}

func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.ready(ctx, ""); err != nil {
		return nil, err
	}
	sp, err := s.sp.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{t: s.t, sp: sp, guarded: s.t.guarded}, nil
}

// Commit releases the savepoint after sending what was queued inside it.
func (s *savepoint) Commit(ctx context.Context) error {
	if s.done {
		return s.sp.Commit(ctx) // pgx.ErrTxClosed
	}
	if err := s.ready(ctx, ""); err != nil {
		return err
	}
	s.done = true
	return s.sp.Commit(ctx)
}

// Rollback rolls the savepoint back and drops what was queued inside it and
// not yet sent. Everything queued before it was sent when it began.
func (s *savepoint) Rollback(ctx context.Context) error {
	if s.done {
		return s.sp.Rollback(ctx) // pgx.ErrTxClosed
	}
	s.done = true
	s.t.queue = nil
	if !s.guarded {
		s.t.guarded = false // declared again with the next send
	}
	if err := s.t.escaped(); err != nil {
		return err
	}
	return s.sp.Rollback(ctx)
}

func (s *savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := s.ready(ctx, ""); err != nil {
		return 0, err
	}
	return s.sp.CopyFrom(ctx, table, cols, src)
}

func (s *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := s.t.check(q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if err := s.t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return s.sp.SendBatch(ctx, b)
}

// LargeObjects sends what was queued first; pgx gives it no way to carry
// an error, so a failed send fails the phase instead.
func (s *savepoint) LargeObjects() pgx.LargeObjects {
	if err := s.ready(context.Background(), ""); err != nil {
		s.t.err = err
	}
	return s.sp.LargeObjects()
}

func (s *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.t.check(sql); err != nil {
		return nil, err
	}
	return s.sp.Prepare(ctx, name, sql)
}

func (s *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.ready(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.sp.Exec(ctx, sql, args...)
}

func (s *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.ready(ctx, sql); err != nil {
		return nil, err
	}
	return s.sp.Query(ctx, sql, args...)
}

func (s *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := s.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

// Conn is the phase's Conn: see phaseTx.Conn.
func (s *savepoint) Conn() *pgx.Conn { return s.t.Conn() }
