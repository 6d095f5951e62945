package keystore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// The operator's statements on one key: unpark, forget, record a verdict.
// None of them is on a request's path; each is keyed by (scope, key).

// unparkSQL: see atomicphase_schedule in schema.sql.
const unparkSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_schedule($1::text, $2::text, $3::boolean)`

// Unpark clears a parked key's mark and backoff and gives it a fresh
// attempt budget. It reports false, changing nothing, when the key is not
// parked, finished or absent.
func (s *Store) Unpark(ctx context.Context, db DB, scope, key string) (bool, error) {
	return s.schedule(ctx, db, scope, key, true)
}

// MakeDue clears the backoff of an unfinished key that is not parked, its
// attempts as they are. It reports false, changing nothing, for a parked,
// finished or absent key.
func (s *Store) MakeDue(ctx context.Context, db DB, scope, key string) (bool, error) {
	return s.schedule(ctx, db, scope, key, false)
}

func (s *Store) schedule(ctx context.Context, db DB, scope, key string, unpark bool) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql.unpark, scope, key, unpark).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// forgetReadSQL reads whether a key is unsettled (unsettledSQL), and what
// that was judged by. A read: the time is the node's that holds the key.
const forgetReadSQL = `SELECT ` + unsettledSQL + `, lock_token, unknown_at, call_until, parked_at, called_at
FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1::text AND idempotency_key = $2::text`

// forgetSQL deletes a finished key, or a parked one nobody holds, as it
// was read: its lock token, its park and its unknown-outcome, call and
// called marks the same (a call mark, once past, stays past), so the
// statement takes no time of its own, which on Citus the coordinator would
// evaluate by its own clock. A key parked (or marked) after the read, even
// under the same token, is left alone.
const forgetSQL = `
DELETE FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1::text AND idempotency_key = $2::text
  AND ((response_status IS NOT NULL AND $8::boolean) OR (response_status IS NULL AND parked_at IS NOT NULL AND locked_at IS NULL))
  AND lock_token = $3::bigint
  AND unknown_at IS NOT DISTINCT FROM $4::timestamptz AND call_until IS NOT DISTINCT FROM $5::timestamptz
  AND parked_at IS NOT DISTINCT FROM $6::timestamptz AND called_at IS NOT DISTINCT FROM $7::timestamptz`

// Forget deletes a finished key (when finished is set), or a parked one
// nobody holds, unless it is unsettled (see unsettledSQL) and force is
// false. It reports false, changing nothing, for any other key or an
// absent one.
func (s *Store) Forget(ctx context.Context, db DB, scope, key string, force, finished bool) (bool, error) {
	var unsettled bool
	var token int64
	var unknownAt, callUntil, parkedAt, calledAt *time.Time
	err := db.QueryRow(ctx, s.sql.forgetRead, scope, key).Scan(&unsettled, &token, &unknownAt, &callUntil, &parkedAt, &calledAt)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && unsettled && !force) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	args := []any{scope, key, token, unknownAt, callUntil, parkedAt, calledAt, finished}
	if b, ok := db.(Beginner); ok && unsettled {
		return forgetForced(ctx, b, s.sql.forget, args)
	}
	tag, err := db.Exec(ctx, s.sql.forget, args...)
	return tag.RowsAffected() == 1, err
}

// forgetForced runs forgetSQL in a transaction that says, to the trigger
// that refuses to delete an unsettled key (migration 019), that this is a
// forced forget, on every node (Citus sends the transaction's SET LOCALs
// to its workers when asked to; the setting is of no effect elsewhere).
// The audit trail already holds the forget, with who forced it and why,
// and on a single node the trigger finds it there too.
func forgetForced(ctx context.Context, db Beginner, sql string, args []any) (gone bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, set := range []string{`SET LOCAL citus.propagate_set_commands = 'local'`, `SET LOCAL atomicphase.forget_forced = 'on'`} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, sql, args...)
		gone = tag.RowsAffected() == 1
		return err
	})
	return gone, err
}

// recordResolutionSQL: see atomicphase_record_verdict in schema.sql.
const recordResolutionSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_record_verdict(
	$1::text, $2::text, $3::boolean, $4::text, $5::bigint, $6::jsonb)`

// Resolution is what RecordResolution did.
type Resolution int

const (
	// NotResolvable: the key is finished, held by a live attempt, or absent.
	NotResolvable Resolution = iota
	// NoUnknownOutcome: the key is unfinished and unheld, but waits on no
	// unknown outcome, so no verdict was recorded.
	NoUnknownOutcome
	// Resolved: the verdict was recorded, the key made due with a fresh
	// budget of attempts.
	Resolved
)

// RecordResolution records an operator's verdict on the call an unfinished
// key waits on (with the call's result as JSON, or nil), makes the key due
// and resets its attempts, and says what it did; it changes nothing unless
// it answers Resolved.
func (s *Store) RecordResolution(ctx context.Context, db DB, scope, key string, happened bool, note string, result []byte) (Resolution, error) {
	var workflow string
	var recorded bool
	var res any // a nil []byte would be sent as an empty string, not NULL
	if result != nil {
		res = string(result)
	}
	err := db.QueryRow(ctx, s.sql.recordResolution, scope, key, happened, note, s.lockTimeoutUS, res).Scan(&workflow, &recorded)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return NotResolvable, nil
	case err != nil:
		return NotResolvable, err
	case !recorded:
		return NoUnknownOutcome, nil
	}
	return Resolved, nil
}
