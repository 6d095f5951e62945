package atomicphase

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/keystore"
	"github.com/atomicphase/atomicphase/internal/txcontrol"
)

// phaseTx is the Tx a phase function receives: one transaction, shared by
// the phases that fuse into it (see attempt.unit). It begins lazily,
// pipelining BEGIN with the first statement sent, so a transaction costs no
// round trip of its own for BEGIN; it holds queued statements (Tx.Queue)
// until the next send; and it leaves COMMIT and ROLLBACK to the Runner,
// which pipelines COMMIT with the recovery point. When the transaction also
// records a new key (rec), the recording travels first, in the same round
// trip as whatever is sent first.
type phaseTx struct {
	conn *pgx.Conn
	opts pgx.TxOptions
	tx   pgx.Tx // nil until the first send
	err  error  // a failure no pgx.Tx method could return
	// guard is set once Conn handed out the connection: the guard cursor
	// is declared with the next send (guarded, once it is).
	guard, guarded bool
	// refused is the first refusal of transaction control, or of a
	// statement sent once the transaction was ended through Conn: it
	// fails the phase whatever its function returns.
	refused error
	// driverErr is the first error Exec, Query or a QueryRow's Scan
	// returned to the phase, so that a failure the phase passes on can be
	// told to be the database's or the driver's (see classify).
	driverErr error
	// phase is the phase whose function runs now; queued statements are
	// charged to it.
	phase string
	// rec records the key, until sent.
	rec *keystore.Recording
	// recordWith, set by the commit of a unit sent whole, has rec go at
	// the head of the batch as the final insert with this checkpoint
	// (keystore.Recording.QueueRecord), instead of as a claim.
	recordWith *keystore.Checkpoint
	// assumed prepares the statements of a batch that assumes its key is
	// new (rec.Assumes) by name; nil for none. named are the texts it
	// prepared for the batch sent last.
	assumed *assumedStatements
	named   []string
	// queue holds the statements queued since the last send, in queueBuf
	// while they fit: most units queue a few, and a send is over before
	// the next statement is queued.
	queue    []queued
	queueBuf [4]queued
	// other is set once a statement was queued that is not a row
	// statement (txcontrol.RowStatements): the transaction then needs a
	// transaction block, and is never sent implicitly.
	other bool
}

var _ Tx = (*phaseTx)(nil)

// queued is a statement a phase queued with Tx.Queue.
type queued struct {
	sql   string
	args  []any
	phase string
}

// queuedError is a queued statement's failure, charged to the phase that
// queued it: the error may surface while a later phase of the same
// transaction sends.
type queuedError struct {
	phase string
	err   error
}

func (e *queuedError) Error() string { return e.err.Error() }
func (e *queuedError) Unwrap() error { return e.err }

func newPhaseTx(conn *pgx.Conn, iso pgx.TxIsoLevel) *phaseTx {
	return &phaseTx{conn: conn, opts: pgx.TxOptions{IsoLevel: iso}}
}

// begun reports whether the transaction was opened on the server.
func (t *phaseTx) begun() bool { return t.tx != nil }

// pending reports whether anything waits to be sent.
func (t *phaseTx) pending() bool {
	return t.rec != nil || len(t.queue) > 0 || t.guard && !t.guarded
}

// Queue adds a statement to be sent with the transaction's next send. A
// statement that is transaction control is refused (not queued), and the
// phase fails.
func (t *phaseTx) Queue(sql string, args ...any) {
	if t.refuseControl(sql) != nil {
		return
	}
	if !t.other && !txcontrol.RowStatements(sql) {
		t.other = true
	}
	if t.queue == nil {
		t.queue = t.queueBuf[:0]
	}
	t.queue = append(t.queue, queued{sql: sql, args: args, phase: t.phase})
}

// send sends, in one round trip: BEGIN unless the transaction has begun,
// the key's recording and the queued statements when there are any, then
// the statements tail adds (tail may be nil). It reads the results ahead of
// tail's and returns the batch positioned at tail's first result, for the
// caller to read and close.
func (t *phaseTx) send(ctx context.Context, tail func(*pgx.Batch)) (pgx.BatchResults, error) {
	return t.sendBatch(ctx, true, tail)
}

// implicit reports whether the transaction may be sent whole as one batch
// without BEGIN and COMMIT, committed by the batch's implicit transaction:
// nothing was sent yet, it has the server's default isolation, Conn was
// never handed out (the guard needs a transaction block), and every queued
// statement reads or writes rows and nothing else. A LOCK TABLE or a
// DECLARE needs a transaction block, and a CALL of a procedure that
// commits, refused inside one, would commit the statements before it: any
// such statement keeps BEGIN and COMMIT.
func (t *phaseTx) implicit() bool {
	return t.tx == nil && t.opts.IsoLevel == "" && !t.guard && !t.other
}

// sendBatch is send, except that without mayBegin it sends no BEGIN: for
// the transaction's last batch, sent implicitly (the caller then queues no
// COMMIT), whose statements run in one implicit transaction that the
// server commits after the last of them, or rolls back whole when one
// fails. One PostgreSQL only: see keystore.Store.Features.
func (t *phaseTx) sendBatch(ctx context.Context, mayBegin bool, tail func(*pgx.Batch)) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	begin := t.tx == nil && mayBegin
	if begin && t.rec != nil && t.rec.Assumes() {
		// A key that exists would fail the claim inside a transaction
		// block, which then costs a ROLLBACK: the key is read first, on
		// its own.
		if err := t.rec.ReadAhead(ctx, t.conn); err != nil {
			return nil, err
		}
	}
	if begin {
		b.BeginTx(t.opts)
	}
	guard := t.guard && !t.guarded
	if guard {
		b.Queue(guardDeclare)
	}
	rec, queue := t.rec, t.queue
	t.rec, t.queue = nil, nil
	switch {
	case rec != nil && t.recordWith != nil:
		rec.QueueRecord(b, t.recordWith)
	case rec != nil:
		rec.Queue(b)
	}
	for _, q := range queue {
		b.Queue(q.sql, q.args...)
	}
	if tail != nil {
		tail(b)
	}
	if rec != nil && rec.Assumes() {
		// The batch fails when the key exists: see assume_prepare.go.
		t.named = t.assumed.prepare(ctx, t.conn, b)
	}
	br := t.conn.SendBatch(ctx, b)
	if begin {
		t.tx = br.Tx()
		if _, err := br.Exec(); err != nil { // BEGIN's result
			if rec != nil {
				// Or the recording's, when pgx prepared or described the
				// batch first.
				err = rec.BeforeRead(err)
			}
			return nil, closeAfter(br, err)
		}
	}
	if guard {
		if _, err := br.Exec(); err != nil {
			return nil, closeAfter(br, err)
		}
		t.guarded = true
	}
	if rec != nil {
		if err := rec.Read(br); err != nil {
			return nil, rec.Resolve(ctx, t.conn, closeAfter(br, err))
		}
	}
	for _, q := range queue {
		if _, err := br.Exec(); err != nil {
			return nil, closeAfter(br, &queuedError{phase: q.phase, err: err})
		}
	}
	return br, nil
}

// closeAfter closes a batch that failed with err and returns err (with the
// close's own error when it says something else).
func closeAfter(br pgx.BatchResults, err error) error {
	if cerr := br.Close(); cerr != nil && !errors.Is(err, cerr) && cerr.Error() != err.Error() {
		return errors.Join(err, cerr)
	}
	return err
}

// flush sends whatever waits (BEGIN, the recording, queued statements),
// for the operations that cannot carry it along.
func (t *phaseTx) flush(ctx context.Context) error {
	if t.tx != nil && !t.pending() {
		return nil
	}
	br, err := t.send(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

// met notes err as one the transaction returned to the phase, and returns
// it. pgx.ErrNoRows is the phase's to judge, not a failure.
func (t *phaseTx) met(err error) error {
	if err != nil && t.driverErr == nil && !errors.Is(err, pgx.ErrNoRows) {
		t.driverErr = err
	}
	return err
}

func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.exec(ctx, sql, args...)
	return tag, t.met(err)
}

func (t *phaseTx) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx != nil && !t.pending() {
		return t.tx.Exec(ctx, sql, args...)
	}
	br, err := t.send(ctx, func(b *pgx.Batch) { b.Queue(sql, args...) })
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if err != nil {
		return tag, closeAfter(br, err)
	}
	return tag, br.Close()
}

func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	rows, err := t.query(ctx, sql, args...)
	return rows, t.met(err)
}

func (t *phaseTx) query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx != nil && !t.pending() {
		return t.tx.Query(ctx, sql, args...)
	}
	br, err := t.send(ctx, func(b *pgx.Batch) { b.Queue(sql, args...) })
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, closeAfter(br, err)
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &row{rows: rows, err: err, tx: t}
}

// SendBatch sends b after whatever waits to be sent: in one round trip
// when nothing does.
func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := t.check(q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if err := t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.escaped(); err != nil {
		return 0, err
	}
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

func (t *phaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	return t.conn.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint) inside the phase.
// Statements queued while it is open follow it: sent inside it before it
// is released, dropped when it rolls back.
func (t *phaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.escaped(); err != nil {
		return nil, err
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{t: t, sp: sp, guarded: t.guarded}, nil
}

// LargeObjects begins the transaction first, since large objects only work
// inside one. pgx gives LargeObjects no way to carry an error, so if BEGIN
// fails (the connection broke) the returned value is unusable and the
// phase's commit reports the error.
func (t *phaseTx) LargeObjects() pgx.LargeObjects {
	if err := t.flush(context.Background()); err != nil {
		t.err = err
		if t.fence(context.Background()); t.tx == nil {
			return pgx.LargeObjects{}
		}
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
// commit reports the error. Transaction control sent through the returned
// connection (pgx.BeginFunc on it, a COMMIT) is not seen as it is sent: a
// COMMIT fails on the guard (see guardDeclare) and rolls the transaction
// back, and a transaction so ended fails the phase permanently at the next
// statement sent through the Tx, or when the phase's function returns
// (escaped).
//
// When the flush fails before a transaction was begun (the key's read ahead
// found the key, so the unit will not run), the connection is handed over
// inside a read-only transaction that carries the guard: nothing sent
// through it writes, and the phase's failure rolls it back.
func (t *phaseTx) Conn() *pgx.Conn {
	t.guard = true
	ctx := context.Background()
	if err := t.flush(ctx); err != nil {
		t.err = err
		t.fence(ctx)
	}
	return t.conn
}

// fence begins, after a flush that failed before its BEGIN was sent, a
// read-only transaction carrying the guard on the connection, so that
// whatever the phase sends through what Conn or LargeObjects returned
// writes nothing and rolls back with the failed phase.
func (t *phaseTx) fence(ctx context.Context) {
	if t.tx != nil || t.conn.IsClosed() {
		return
	}
	tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return
	}
	t.tx = tx
	if _, err := tx.Exec(ctx, guardDeclare); err == nil {
		t.guarded = true
	}
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
	tx   *phaseTx
}

func (r *row) Scan(dest ...any) error {
	return r.tx.met(r.scan(dest...))
}

func (r *row) scan(dest ...any) error {
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
