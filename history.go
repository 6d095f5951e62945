package atomicphase

import (
	"context"
	"time"
)

// A key's history: what went wrong with it, as the database recorded it
// (migration 019). The key table's trigger writes an event when an attempt
// fails, leaves a call's outcome unknown or parks the key; when an attempt
// takes a key that went wrong, or one whose holder's lease ran out; when
// an operator unparks it or records a verdict; and when a key that went
// wrong finishes. A request that succeeds first time writes none. The history is kept beside the key and deleted with it;
// who took an operator's action, and why, is in the audit trail
// (AuditTrail).

// KeyEvent is one event of a key's history.
type KeyEvent struct {
	// ID orders a key's events (a later event has a greater ID).
	ID int64 `json:"id"`
	// At is when it happened, by the database's clock.
	At time.Time `json:"at"`
	// Event is what happened: "failed" (an attempt failed, the key waits
	// to be resumed), "unknown" (an attempt left a foreign call's outcome
	// unknown), "parked", "resumed" (a retry, Resume or the sweep took the
	// key), "taken_over" (an attempt took the key from one whose lease ran
	// out), "unparked", "resolved" (an operator's verdict), "settled" (an
	// unknown outcome settled without an attempt) or "finished" (the
	// finish of a key that went wrong).
	Event string `json:"event"`
	// StatusBefore and Status are the key's stored states around the
	// event: running, waiting, unknown, parked or finished
	// (docs/concepts.md, "The key's states").
	StatusBefore string `json:"status_before"`
	Status       string `json:"status"`
	// RecoveryPoint is the key's recovery point after the event.
	RecoveryPoint string `json:"recovery_point"`
	// Attempt is the key's attempt count after the event, and LockToken
	// the lock token of the attempt the event is of: the one that failed
	// or parked the key, or the one that took it.
	Attempt   int   `json:"attempt"`
	LockToken int64 `json:"lock_token"`
	// Error is why the attempt failed, for a failure (as KeyInfo.LastError
	// said then); nil otherwise.
	Error *string `json:"error,omitempty"`
}

// DefaultHistoryLimit is how many events KeyHistory reads when given no
// limit.
const DefaultHistoryLimit = 200

// KeyHistory returns a key's newest limit events (DefaultHistoryLimit when
// limit <= 0), oldest first; none for a key that never went wrong, or one
// that does not exist. The database keeps a key's newest 1000 events (a
// key retried without end drops its oldest as its attempts pass each
// hundred), and blanks their error texts when the key finishes. It needs
// migration 019 (ErrSchemaMissing on an older schema).
func (r *Runner) KeyHistory(ctx context.Context, scope, key string, limit int) ([]*KeyEvent, error) {
	if limit <= 0 {
		limit = DefaultHistoryLimit
	}
	rows, err := r.store.History(ctx, r.poolFor(scope), scope, key, limit)
	if err != nil {
		return nil, storeError("read key history", err)
	}
	out := make([]*KeyEvent, len(rows))
	for i, e := range rows {
		out[i] = &KeyEvent{ID: e.ID, At: e.At, Event: e.Event, StatusBefore: e.StatusBefore, Status: e.Status,
			RecoveryPoint: e.RecoveryPoint, Attempt: e.Attempt, LockToken: e.LockToken, Error: e.Error}
	}
	return out, nil
}
