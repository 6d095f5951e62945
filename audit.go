package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The operators' audit trail: who did what to which key, when, and why.
// The console (apui) and the CLI record every action they take through
// RecordAudit; a service that calls the operator methods (Unpark, Forget,
// RecordResolution) itself records its own. The trail is a table of its
// own (atomicphase_audit), so it outlives the key: forget and the reap
// delete the key's row, never its trail.

// AuditEntry is one action an operator took on a key.
type AuditEntry struct {
	// ID orders a key's entries (a later entry has a greater ID); pass the
	// last one read to AuditTrailBefore for the page after it. RecordAudit
	// ignores it.
	ID    int64  `json:"id"`
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// At is when it was recorded, by the database's clock; RecordAudit
	// ignores it.
	At time.Time `json:"at"`
	// Actor is who acted, as the embedding service or the CLI's
	// environment identifies them. Required.
	Actor string `json:"actor"`
	// Action is what they did: "resume", "unpark", "forget", "resolve", or
	// the embedding service's own word. Required.
	Action string `json:"action"`
	// Note is why, in their words: at most MaxAuditNote bytes.
	Note string `json:"note"`
	// Detail is what the action carried, as JSON (a verdict and the call's
	// result, a bulk action's filter), at most MaxAuditDetail bytes; nil if
	// nothing.
	Detail json.RawMessage `json:"detail,omitempty"`
}

// DefaultAuditLimit is how many entries AuditTrail reads when given no
// limit.
const DefaultAuditLimit = 100

// The bounds of an audit entry: the trail is kept for
// SweepConfig.AuditRetention and shown on a key's page, so no entry may
// grow it without bound.
const (
	MaxAuditNote   = 2000
	MaxAuditDetail = 64 << 10
)

// RecordAudit appends e to the key's audit trail. It does not check that
// the key exists: the trail of a forgotten key goes on. It returns an
// error, recording nothing, when Actor or Action is empty or Detail is not
// JSON.
func (r *Runner) RecordAudit(ctx context.Context, e *AuditEntry) error {
	switch {
	case e == nil || e.Actor == "" || e.Action == "":
		return errors.New("atomicphase: an AuditEntry needs its Actor (who) and Action (what)")
	case e.Detail != nil && !json.Valid(e.Detail):
		return errors.New("atomicphase: AuditEntry.Detail is not JSON")
	case len(e.Note) > MaxAuditNote:
		return fmt.Errorf("atomicphase: AuditEntry.Note is %d bytes; the most is %d (MaxAuditNote): say why in fewer words, and point to where the rest is", len(e.Note), MaxAuditNote)
	case len(e.Detail) > MaxAuditDetail:
		return fmt.Errorf("atomicphase: AuditEntry.Detail is %d bytes; the most is %d (MaxAuditDetail)", len(e.Detail), MaxAuditDetail)
	}
	err := r.store.RecordAudit(ctx, r.pool, &keystore.AuditEntry{Scope: e.Scope, Key: e.Key, Actor: e.Actor,
		Action: e.Action, Note: e.Note, Detail: e.Detail})
	if err != nil {
		return storeError("record audit", err)
	}
	return nil
}

// AuditTrail reads the audit trail of a key, newest first, at most limit
// entries (DefaultAuditLimit when limit <= 0). A key with no trail, or none
// at all, has an empty one. AuditTrailBefore reads the entries after them.
func (r *Runner) AuditTrail(ctx context.Context, scope, key string, limit int) ([]*AuditEntry, error) {
	return r.AuditTrailBefore(ctx, scope, key, 0, limit)
}

// AuditTrailBefore reads the entries of a key's audit trail older than the
// entry whose ID is before (all of them when before is 0), newest first, at
// most limit (DefaultAuditLimit when limit <= 0): the trail page by page,
// by the primary key's index, however long it is.
func (r *Runner) AuditTrailBefore(ctx context.Context, scope, key string, before int64, limit int) ([]*AuditEntry, error) {
	if limit <= 0 {
		limit = DefaultAuditLimit
	}
	rows, err := r.store.AuditTrail(ctx, r.pool, scope, key, before, limit)
	if err != nil {
		return nil, storeError("read audit trail", err)
	}
	out := make([]*AuditEntry, len(rows))
	for i, row := range rows {
		out[i] = &AuditEntry{ID: row.ID, Scope: row.Scope, Key: row.Key, At: row.At, Actor: row.Actor, Action: row.Action,
			Note: row.Note, Detail: row.Detail}
	}
	return out, nil
}

// ReapAudit deletes the audit entries recorded longer than olderThan ago,
// and returns how many it deleted. The Sweeper calls it with
// SweepConfig.AuditRetention, at most once an hour (the trail has no index
// on its time: each call reads it whole); it is also for a cron job.
func (r *Runner) ReapAudit(ctx context.Context, olderThan time.Duration) (int, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("atomicphase: ReapAudit(%s): want a non-negative age", olderThan)
	}
	n, err := r.store.ReapAudit(ctx, r.pool, olderThan)
	if err != nil {
		return n, storeError("reap audit trail", err)
	}
	return n, nil
}
