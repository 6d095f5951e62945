package atomicphase

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
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
	// point is the committed phase's name, or RecoveryPointFinished.
	point string
	// jumpTarget is the phase a retry runs next when the phase jumped, ""
	// when it continued in order.
	jumpTarget string
	state      []byte
	resp       *Response
}

// checkpointSQL advances the recovery point if, and only if, the lock token
// still matches (see atomicphase_checkpoint in schema.sql).
const checkpointSQL = `SELECT /* TEMPLATE: schema */atomicphase_checkpoint(
	$1::text, $2::text, $3::bigint, $4::text, $5::text, $6::bytea, $7::integer, $8::jsonb, $9::bytea)`

// commit stores cp with everything the unit wrote through tx, atomically,
// in one round trip: whatever waits to be sent (BEGIN, the key's recording,
// queued writes), the checkpoint and COMMIT travel as one batch. The
// checkpoint raises if the lock token moved on, and the server then skips
// the COMMIT queued behind it, rolling back the unit's writes. When the
// unit wrote nothing the checkpoint is a single statement. A lost lock is
// reported as ErrLockLost.
func (a *attempt) commit(ctx context.Context, conn *pgx.Conn, tx *phaseTx, cp *checkpoint) error {
	args, err := a.checkpointArgs(cp)
	if err != nil {
		return err
	}
	if tx.begun() || tx.pending() {
		var br pgx.BatchResults
		br, err = tx.send(ctx, func(b *pgx.Batch) {
			b.Queue(a.r.sql.checkpoint, args...)
			b.Queue("COMMIT")
		})
		if err == nil {
			err = br.Close()
		}
	} else {
		_, err = conn.Exec(ctx, a.r.sql.checkpoint, args...)
	}
	if isLockLost(err) {
		return ErrLockLost
	}
	return err
}

// checkpointArgs are atomicphase_checkpoint's arguments for cp.
func (a *attempt) checkpointArgs(cp *checkpoint) ([]any, error) {
	var jumpTarget *string
	if cp.jumpTarget != "" {
		jumpTarget = &cp.jumpTarget
	}
	args := []any{a.scope, a.key, a.token, cp.point, jumpTarget, cp.state, nil, nil, nil}
	if resp := cp.resp; resp != nil {
		// The header travels as JSON text, which a jsonb parameter takes in
		// every pgx query exec mode, the simple protocol included.
		var header *string
		if len(resp.Header) > 0 {
			b, err := json.Marshal(resp.Header)
			if err != nil {
				return nil, Permanent(fmt.Errorf("encode response header: %w", err))
			}
			h := string(b)
			header = &h
		}
		body := resp.Body
		if body == nil {
			body = []byte{}
		}
		args[6], args[7], args[8] = resp.Status, header, body
	}
	return args, nil
}
