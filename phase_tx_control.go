package atomicphase

import (
	"fmt"

	"github.com/atomicphase/atomicphase/internal/txcontrol"
)

// A phase's transaction refuses to be ended from inside the phase: the
// control statements it finds in SQL text, the guard that makes a COMMIT
// sent through Tx.Conn fail, and what a phase that escaped ends with.

// The phase's transaction cannot be ended from inside the phase: the
// Runner commits it with the recovery point, so that what the phase wrote
// and the key's progress commit together or not at all. A phase that
// commits its writes itself makes them outlive its own failure, and the
// retry writes them again. Transaction control in SQL text is refused
// before it is sent (check); transaction control through Conn, which no
// method here sees, is found on the next statement sent through the Tx and
// when the phase's function returns (escaped), and the phase fails closed:
// permanently, so that no retry repeats what already committed.

// The guard makes a COMMIT the Runner did not send fail, and roll the
// transaction back: a phase transaction whose Conn was handed out declares
// (pipelined with what it sends next) a cursor WITH HOLD whose query fails
// when it runs, and a holdable cursor's query runs when its transaction
// commits. The Runner closes the cursor in its commit's batch, just before
// COMMIT (guardClose); a COMMIT sent through Conn (pgx.BeginFunc's, say)
// finds it open and fails, with the message below, before anything
// commits. random() keeps the query from being evaluated (and failing) when
// it is planned. Only Conn needs it: the Tx's own methods refuse
// transaction control before sending it, so a phase that never asks for
// Conn pays nothing.
const (
	guardDeclare = `DECLARE ap_phase_guard CURSOR WITH HOLD FOR SELECT ('atomicphase: refused: a COMMIT sent from inside a phase, through Tx.Conn; the Runner commits the phase with its recovery point ' || random())::int`
	guardClose   = `CLOSE ap_phase_guard`
)

// check refuses, before anything is sent, a statement that is transaction
// control, and any statement once the transaction was ended through Conn
// (it would run in autocommit). The refusal also fails the phase.
func (t *phaseTx) check(sql string) error {
	if err := t.escaped(); err != nil {
		return err
	}
	return t.refuseControl(sql)
}

func (t *phaseTx) refuseControl(sql string) error {
	if t.refused != nil {
		return t.refused
	}
	if stmt, ok := txcontrol.Find(sql); ok {
		t.refused = Permanent(fmt.Errorf("%w: the phase sent %q, which would end its transaction; return an error from the phase to roll it back, and leave the commit to the Runner", ErrPhaseTxControl, stmt))
	}
	return t.refused
}

// escaped reports, as the phase's permanent failure, a transaction that was
// begun and is no longer open on the connection: a COMMIT sent through Conn
// (pgx.BeginFunc on it, say), which the guard made fail and roll back, or a
// ROLLBACK, ended it. Nothing the phase wrote in it committed; but what it
// sent through Conn since ran in autocommit.
func (t *phaseTx) escaped() error {
	if t.refused != nil {
		return t.refused
	}
	// A broken connection (a terminated backend, a lost network) ended
	// the transaction too, but nothing of it committed: that failure is the
	// statement's own, and transient. Only a phase that was handed Conn can
	// end the transaction (the Tx refuses transaction control), and only
	// once the guard was declared has the transaction surely begun on the
	// server: a send that failed before BEGIN ran (an argument pgx could
	// not encode, say) leaves the connection idle too.
	if t.guarded && !t.conn.IsClosed() && t.conn.PgConn().TxStatus() == 'I' {
		t.refused = Permanent(fmt.Errorf("%w: its writes rolled back; send nothing through Tx.Conn that commits or rolls back (pgx.BeginFunc on it does), and return an error from the phase to roll it back", ErrPhaseTxEscaped))
	}
	return t.refused
}

// end returns what the phase ends with, given its function's error: the
// refusal or escape first (the function may have swallowed it), then the
// function's own error, then a failure no method could return.
func (t *phaseTx) end(err error) error {
	if rerr := t.escaped(); rerr != nil {
		return rerr
	}
	if err == nil {
		err = t.err
	}
	return err
}
