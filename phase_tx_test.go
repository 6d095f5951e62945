package atomicphase_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// Statements sent through tx.Conn() belong to the phase's transaction: they
// roll back with a failed phase.
func TestPhaseTxConnIsInsideTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("conn", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			if _, err := tx.Conn().Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'write')`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if fail.Swap(false) {
				return atomicphase.Outcome{}, errors.New("phase fails after writing")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "the failed phase's write survived")
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// escapeWorkflow writes one effect row with write, then fails its first
// attempt (as a later statement or a crash would) and succeeds on the
// retry: a write that escaped the phase's transaction is written twice.
func escapeWorkflow(name string, write func(ctx context.Context, tx atomicphase.Tx) error) *atomicphase.Workflow[struct{}] {
	var fail atomic.Bool
	fail.Store(true)
	type st = struct{}
	return atomicphase.MustWorkflow(name, startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			if err := write(ctx, tx); err != nil {
				return atomicphase.Outcome{}, err
			}
			if fail.Swap(false) {
				return atomicphase.Outcome{}, errors.New("phase fails after writing")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
}

const insertEffect = `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'write')`

// TestPhaseTxRefusesTransactionControlInSQL: a COMMIT (or its synonyms,
// alone or after another statement) sent through the phase's Tx is refused
// before it is sent, so nothing the phase wrote commits on its own; the
// phase fails permanently even when its function swallows the refusal, and
// the key is parked: one effect row at most, never two.
func TestPhaseTxRefusesTransactionControlInSQL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		write func(ctx context.Context, tx atomicphase.Tx) error
	}{
		{"exec commit", func(ctx context.Context, tx atomicphase.Tx) error {
			if _, err := tx.Exec(ctx, insertEffect); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		}},
		{"two statements", func(ctx context.Context, tx atomicphase.Tx) error {
			_, err := tx.Exec(ctx, insertEffect+"; END")
			return err
		}},
		{"swallowed", func(ctx context.Context, tx atomicphase.Tx) error {
			tx.Queue(insertEffect)
			_, _ = tx.Exec(ctx, "commit; begin")
			return nil
		}},
		{"queued", func(ctx context.Context, tx atomicphase.Tx) error {
			tx.Queue(insertEffect)
			tx.Queue("COMMIT")
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		}},
		{"batch", func(ctx context.Context, tx atomicphase.Tx) error {
			b := &pgx.Batch{}
			b.Queue(insertEffect)
			b.Queue("COMMIT AND CHAIN")
			return tx.SendBatch(ctx, b).Close()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			wf := escapeWorkflow("sqlcontrol", c.write)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
			_, err := b.runner.Run(b.ctx, wf, req)
			require.ErrorIs(t, err, atomicphase.ErrPhaseTxControl)
			require.ErrorIs(t, err, atomicphase.ErrPermanent)
			_, _ = b.runner.Run(b.ctx, wf, req) // the client retries
			require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "a write committed by the phase itself")
		})
	}
}

// TestPhaseTxEscapeThroughConnFailsClosed: a COMMIT sent through tx.Conn()
// — pgx.BeginFunc on it, as any helper taking a *pgx.Conn does, or a
// COMMIT of its own — which no method of the Tx sees, fails on the server
// and rolls the phase's transaction back, so nothing it wrote commits; the
// phase fails permanently (at its next statement through the Tx, or when
// it returns), even when its function swallows the error. No effect row
// survives, where two (one per attempt) did.
func TestPhaseTxEscapeThroughConnFailsClosed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		write func(ctx context.Context, tx atomicphase.Tx) error
	}{
		{"BeginFunc", func(ctx context.Context, tx atomicphase.Tx) error {
			return pgx.BeginFunc(ctx, tx.Conn(), func(inner pgx.Tx) error {
				_, err := inner.Exec(ctx, insertEffect)
				return err
			})
		}},
		{"commit swallowed, then more through the Tx", func(ctx context.Context, tx atomicphase.Tx) error {
			if _, err := tx.Exec(ctx, insertEffect); err != nil {
				return err
			}
			_, _ = tx.Conn().Exec(ctx, "COMMIT")
			_, err := tx.Exec(ctx, insertEffect) // would run in autocommit
			return err
		}},
		{"inside a savepoint rolled back", func(ctx context.Context, tx atomicphase.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_ = tx.Conn() // the guard is declared inside the savepoint
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			return pgx.BeginFunc(ctx, tx.Conn(), func(inner pgx.Tx) error {
				_, err := inner.Exec(ctx, insertEffect)
				return err
			})
		}},
		{"commit and begin", func(ctx context.Context, tx atomicphase.Tx) error {
			if _, err := tx.Exec(ctx, insertEffect); err != nil {
				return err
			}
			_, _ = tx.Conn().Exec(ctx, "COMMIT; BEGIN")
			return nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			wf := escapeWorkflow("connescape", c.write)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
			_, err := b.runner.Run(b.ctx, wf, req)
			require.ErrorIs(t, err, atomicphase.ErrPhaseTxEscaped)
			var pe *atomicphase.PhaseError
			require.ErrorAs(t, err, &pe)
			require.True(t, pe.Parked, "the key is parked for an operator")
			_, _ = b.runner.Run(b.ctx, wf, req) // the client retries
			require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "a write committed by the phase itself")
		})
	}
}

// TestPhaseTxQueuedWritesFollowSavepoints: a statement queued while a
// savepoint (tx.Begin) is open is inside it: dropped when it rolls back,
// sent inside it before it is released, in order with the savepoint's own
// statements; and a deferred Rollback after Commit leaves alone what was
// queued since.
func TestPhaseTxQueuedWritesFollowSavepoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	insert := func(phase string) string {
		return `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', '` + phase + `')`
	}
	wf := atomicphase.MustWorkflow("savepoints", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			rolled, err := tx.Begin(ctx)
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(insert("rolled-back"))
			if err := rolled.Rollback(ctx); err != nil {
				return atomicphase.Outcome{}, err
			}

			kept, err := tx.Begin(ctx)
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			defer func() { _ = kept.Rollback(ctx) }()
			tx.Queue(insert("kept"))
			// The queued insert goes first, inside the savepoint.
			if _, err := kept.Exec(ctx, `UPDATE effects SET phase = 'kept-updated' WHERE phase = 'kept'`); err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(insert("released"))
			if err := kept.Commit(ctx); err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(insert("after"))
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"})
	require.NoError(t, err)
	rows, err := b.db.Pool.Query(b.ctx, `SELECT phase FROM effects ORDER BY phase`)
	require.NoError(t, err)
	phases, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"after", "kept-updated", "released"}, phases)
}
