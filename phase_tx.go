package atomicphase

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// phaseTx is the pgx.Tx a phase function receives. It begins its
// transaction lazily, pipelining BEGIN with the phase's first statement so a
// phase costs no round trip of its own for BEGIN, and it leaves COMMIT and
// ROLLBACK to the Runner, which pipelines COMMIT with the recovery point.
type phaseTx struct {
	conn *pgx.Conn
	opts pgx.TxOptions
	tx   pgx.Tx // nil until the first statement
	err  error  // a failure no pgx.Tx method could return
}

var _ pgx.Tx = (*phaseTx)(nil)

func newPhaseTx(conn *pgx.Conn, iso pgx.TxIsoLevel) *phaseTx {
	return &phaseTx{conn: conn, opts: pgx.TxOptions{IsoLevel: iso}}
}

// begun reports whether the transaction was opened on the server.
func (t *phaseTx) begun() bool { return t.tx != nil }

// beginNow opens the transaction with a round trip of its own, for the
// operations that cannot carry BEGIN along.
func (t *phaseTx) beginNow(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// sendWithBegin sends one statement with BEGIN ahead of it in a single
// round trip and returns the batch, positioned at the statement's result.
func (t *phaseTx) sendWithBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil { // BEGIN's result
		return nil, errors.Join(err, br.Close())
	}
	return br, nil
}

func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	br, err := t.sendWithBegin(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, errors.Join(err, br.Close())
}

func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	br, err := t.sendWithBegin(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.beginNow(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.beginNow(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

func (t *phaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint) inside the phase.
func (t *phaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.beginNow(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// LargeObjects begins the transaction first, since large objects only work
// inside one. pgx gives LargeObjects no way to carry an error, so if BEGIN
// fails (the connection broke) the returned value is unusable and the
// phase's commit reports the error.
func (t *phaseTx) LargeObjects() pgx.LargeObjects {
	if err := t.beginNow(context.Background()); err != nil {
		t.err = err
		return pgx.LargeObjects{}
	}
	return t.tx.LargeObjects()
}

// Commit refuses: the Runner commits the phase with its recovery point.
func (t *phaseTx) Commit(context.Context) error { return ErrPhaseTxControl }

// Rollback refuses: return an error from the phase to roll it back.
func (t *phaseTx) Rollback(context.Context) error { return ErrPhaseTxControl }

// Conn begins the transaction first, so that whatever is sent through the
// returned connection runs inside it: before, a statement sent there ran in
// autocommit and outlived a phase that rolled back. pgx gives Conn no way to
// carry an error, so if BEGIN fails (the connection broke) the phase's
// commit reports the error.
func (t *phaseTx) Conn() *pgx.Conn {
	if err := t.beginNow(context.Background()); err != nil {
		t.err = err
	}
	return t.conn
}

// rollback ends an open transaction after a failed phase.
func (t *phaseTx) rollback(ctx context.Context) error {
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// batchRows closes the batch that carried BEGIN once the rows are done.
type batchRows struct {
	pgx.Rows
	br      pgx.BatchResults
	closeEr error
	closed  bool
}

func (r *batchRows) finish() {
	if !r.closed {
		r.closed = true
		r.Rows.Close()
		r.closeEr = r.br.Close()
	}
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) Close() { r.finish() }

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeEr
}

// row is pgx.Row over a Rows, matching pgx's QueryRow semantics.
type row struct {
	rows pgx.Rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
