package keystore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// checkpointSQL advances the recovery point if, and only if, the lock token
// still matches (see atomicphase_checkpoint in schema.sql); it raises
// LockLostCode when the token moved on.
const checkpointSQL = `SELECT /* TEMPLATE: schema */atomicphase_checkpoint(
	$1::text, $2::text, $3::bigint, $4::text, $5::text, $6::bytea, $7::integer, $8::jsonb, $9::bytea)`

// Checkpoint is what a unit's commit stores with its own writes: the new
// recovery point, where a jump goes, the state, and, for the phase that
// responds, the response.
type Checkpoint struct {
	Scope, Key string
	Token      int64
	// Point is the committed phase's name, or "finished".
	Point string
	// JumpTarget is the phase a retry runs next when the phase jumped; nil
	// when it continued in order.
	JumpTarget *string
	State      []byte
	// Status, Header (JSON text) and Body are the response; Status is nil
	// until the phase that responds.
	Status *int
	Header *string
	Body   []byte
	// Args are Scope, Key and Token boxed once (KeyArgs); the zero KeyArgs
	// boxes them on use.
	Args KeyArgs
	// PointArg is Point boxed once (a phase's name, boxed when its
	// workflow is built); nil to box it on use.
	PointArg any
}

// finishedArg is the finished recovery point, boxed once.
var finishedArg any = "finished"

// point returns the recovery point as a statement argument, boxed once
// where it can be.
func (cp *Checkpoint) point() any {
	switch {
	case cp.PointArg != nil:
		return cp.PointArg
	case cp.Point == "finished":
		return finishedArg
	}
	return cp.Point
}

// Checkpoint returns the statement that stores cp, and its arguments, for
// the caller to queue in its transaction's last batch (before COMMIT) or to
// run on its own.
func (s *Store) Checkpoint(cp *Checkpoint) (sql string, args []any) {
	scope, key := cp.Args.scopeKey(cp.Scope, cp.Key)
	args = []any{scope, key, cp.Args.token(cp.Token), cp.point(), cp.JumpTarget, cp.State, nil, nil, nil}
	if cp.Status != nil {
		body := cp.Body
		if body == nil {
			body = []byte{}
		}
		// The header travels as JSON text, which a jsonb parameter takes in
		// every pgx query exec mode, the simple protocol included.
		args[6], args[7], args[8] = *cp.Status, cp.Header, body
	}
	if s.plain.Load() {
		return s.sql.plainCheckpoint, args
	}
	return s.sql.checkpoint, args
}

// FinishEvent returns the statement that writes, with the commit that
// finishes a key that went wrong (an earlier attempt failed, or a verdict
// was taken), the finish in its history, and its arguments, for the caller
// to queue after the checkpoint. The plain checkpoint writes none (a
// request that succeeds first time pays for nothing it does not use); the
// function writes it itself (it knows the key's attempts), and then this
// returns "".
func (s *Store) FinishEvent(cp *Checkpoint, attempts int) (sql string, args []any) {
	if !s.plain.Load() {
		return "", nil
	}
	scope, key := cp.Args.scopeKey(cp.Scope, cp.Key)
	return s.sql.keyEvent, []any{scope, key, "finished", "r", "f", cp.point(), attempts, cp.Args.token(cp.Token)}
}

// takeVerdictSQL takes, once, an operator's verdict recorded for the phase
// after the recovery point an attempt resumed at.
const takeVerdictSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys SET resolved_after = NULL
WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3 AND resolved_after = $4
RETURNING resolved_happened, resolved_result`

// TakeVerdict takes the operator's verdict on the call after resumedFrom
// (RecordResolution), fenced by token, and the call's result it came with
// (nil if none); nil when none was recorded.
func (s *Store) TakeVerdict(ctx context.Context, db DB, scope, key string, token int64, resumedFrom string) (*bool, []byte, error) {
	var happened bool
	var result []byte
	err := db.QueryRow(ctx, s.sql.takeVerdict, scope, key, token, resumedFrom).Scan(&happened, &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return &happened, result, nil
}

// clearLastErrorSQL forgets the error of a key's failed attempts, fenced by
// the lock token, in the transaction that stores its response: the error
// may quote what the client sent, and a finished key needs it no more.
const clearLastErrorSQL = `UPDATE /* TEMPLATE: schema */idempotency_keys SET last_error = NULL
WHERE scope = $1::text AND idempotency_key = $2::text AND lock_token = $3::bigint AND last_error IS NOT NULL`

// ClearLastError returns the statement that forgets a finishing key's last
// error, and its arguments, for the caller to queue before the checkpoint.
func (s *Store) ClearLastError(scope, key string, token int64) (sql string, args []any) {
	return s.sql.clearLastError, []any{scope, key, token}
}
