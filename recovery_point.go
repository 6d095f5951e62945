package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Reserved recovery points. A key is recorded at RecoveryPointStarted and
// reaches RecoveryPointFinished when its response is stored; in between, its
// recovery point is the name of the last phase whose transaction committed.
const (
	RecoveryPointStarted  = "started"
	RecoveryPointFinished = "finished"
)

// resumeAt returns the index of the phase a retry runs, given the stored
// recovery point and jump target: the jump target if one is stored, else the
// phase after the recovery point. len(phases) means past the end.
func (w *Workflow[S]) resumeAt(recoveryPoint, jumpTarget string) (int, error) {
	if jumpTarget != "" {
		i, ok := w.byName[jumpTarget]
		if !ok {
			return 0, fmt.Errorf("atomicphase: workflow %q has no phase %q to resume at", w.name, jumpTarget)
		}
		return i, nil
	}
	if recoveryPoint == RecoveryPointStarted {
		return 0, nil
	}
	i, ok := w.byName[recoveryPoint]
	if !ok {
		return 0, fmt.Errorf("atomicphase: workflow %q has no phase %q; the stored recovery point is unknown", w.name, recoveryPoint)
	}
	return i + 1, nil
}

// checkpoint is what a phase commit stores together with the phase's own
// writes: the new recovery point, where a jump goes, the state, and, for the
// phase that responds, the response.
type checkpoint struct {
	// point is the committed phase's name, or RecoveryPointFinished;
	// pointArg is a phase's name boxed once (step.nameArg), or nil.
	point    string
	pointArg any
	// jumpTarget is the phase a retry runs next when the phase jumped, ""
	// when it continued in order.
	jumpTarget string
	state      []byte
	resp       *Response
	// respValue holds resp when the checkpoint's route made it.
	respValue Response
}

// commit stores cp with everything the unit wrote through tx, atomically,
// in one round trip: whatever waits to be sent (BEGIN, the key's claim,
// queued writes), the checkpoint and COMMIT travel as one batch. The
// checkpoint raises if the lock token moved on, and the server then skips
// the COMMIT queued behind it, rolling back the unit's writes. A unit that
// sent nothing before (every statement queued) goes, on one PostgreSQL,
// without BEGIN and COMMIT: the batch's implicit transaction commits it
// whole or, when the checkpoint raises, not at all. When the unit wrote
// nothing the checkpoint is a single statement. A lost lock is reported as
// ErrLockLost.
//
// A key not recorded yet (its recording rides with this unit) is recorded
// by the commit instead of checkpointed: one INSERT of the row as the
// checkpoint leaves it, so the row is written once; ErrNotRecorded when
// the key was recorded meanwhile by another request (the unit rolls back).
func (a *attempt) commit(ctx context.Context, conn *pgx.Conn, tx *phaseTx, cp *checkpoint) (err error) {
	kc, err := a.checkpointOf(cp)
	if err != nil {
		return err
	}
	var event string
	var eventArgs []any
	if cp.point == RecoveryPointFinished && a.attempts > 1 {
		// An earlier attempt may have failed: its error goes with the
		// commit that stores the response (it may quote the client), and
		// the finish goes in the key's history, after the checkpoint.
		clear, clearArgs := a.r.store.ClearLastError(a.scope, a.key, a.token)
		tx.Queue(clear, clearArgs...)
		event, eventArgs = a.r.store.FinishEvent(kc, a.attempts)
	}
	rec := a.rec
	// A unit sent whole, in one implicit transaction, on one PostgreSQL.
	implicitly := tx.implicit() && a.r.implicitCommits.Load()
	// A new key's recording that was not sent yet (nor anything else: it
	// travels with the first send) goes at the head of the unit's only
	// batch, as the final insert itself, which takes the claim's lock: one
	// statement fewer (keystore.Recording.QueueRecord). Implicitly or
	// inside BEGIN and COMMIT (Citus; a unit that needs a transaction
	// block), alike.
	first := rec != nil && tx.rec == rec && a.r.recordFirst.Load()
	var sql string
	var args []any
	switch {
	case first:
		tx.recordWith = kc
	case rec != nil:
		sql, args = rec.Final(kc)
	default:
		sql, args = a.r.store.Checkpoint(kc)
	}
	sent := time.Now() // the checkpoint renews the lease, from no earlier
	defer func() {
		// A commit that also records the key may have committed even when
		// its answer was lost: its lease then starts no earlier than sent.
		if err == nil || a.rec != nil {
			a.leaseFrom = sent
		}
	}()
	if tx.begun() || tx.pending() {
		// A unit that sent nothing yet (its statements were all queued)
		// goes as one batch; on one PostgreSQL without BEGIN and COMMIT,
		// two statements fewer, its implicit transaction committing all
		// of it or none.
		var br pgx.BatchResults
		br, err = tx.sendBatch(ctx, !implicitly, func(b *pgx.Batch) {
			if !first {
				b.Queue(sql, args...)
			}
			if event != "" {
				b.Queue(event, eventArgs...)
			}
			if tx.guard {
				b.Queue(guardClose)
			}
			if !implicitly {
				b.Queue("COMMIT")
			}
		})
		if err == nil && rec != nil && !first {
			if err = rec.ReadFinal(br); err != nil {
				err = closeAfter(br, err)
			}
		}
		if err == nil {
			err = br.Close()
		}
	} else if event != "" {
		// One batch, the event with the checkpoint (one PostgreSQL: the
		// batch's implicit transaction commits both, or neither).
		b := &pgx.Batch{}
		b.Queue(sql, args...)
		b.Queue(event, eventArgs...)
		err = conn.SendBatch(ctx, b).Close()
	} else {
		_, err = conn.Exec(ctx, sql, args...)
	}
	if keystore.IsLockLost(err) {
		return ErrLockLost
	}
	if first && errors.Is(err, keystore.ErrRecordFirstMissing) {
		// This key's pool lacks migration 020: claim first again, until
		// the next announcement finds the function (and the attempt takes
		// the key on its own, as one recorded meanwhile).
		a.r.recordFirst.Store(false)
	}
	return err
}

// checkpointOf is the key store's checkpoint of cp.
func (a *attempt) checkpointOf(cp *checkpoint) (*keystore.Checkpoint, error) {
	kc := keystore.Checkpoint{Scope: a.scope, Key: a.key, Token: a.token, Args: a.args, Point: cp.point, PointArg: cp.pointArg,
		State: cp.state}
	if cp.jumpTarget != "" {
		kc.JumpTarget = &cp.jumpTarget
	}
	if resp := cp.resp; resp != nil {
		kc.Status, kc.Body = &resp.Status, resp.Body
		if len(resp.Header) > 0 {
			b, err := json.Marshal(resp.Header)
			if err != nil {
				return nil, Permanent(fmt.Errorf("encode response header: %w", err))
			}
			h := string(b)
			kc.Header = &h
		}
	}
	return &kc, nil
}
