package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
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
	// Note is why, in their words.
	Note string `json:"note"`
	// Detail is what the action carried, as JSON (a verdict and the call's
	// result, a bulk action's filter); nil if nothing.
	Detail json.RawMessage `json:"detail,omitempty"`
}

// DefaultAuditLimit is how many entries AuditTrail reads when given no
// limit.
const DefaultAuditLimit = 100

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
// at all, has an empty one.
func (r *Runner) AuditTrail(ctx context.Context, scope, key string, limit int) ([]*AuditEntry, error) {
	if limit <= 0 {
		limit = DefaultAuditLimit
	}
	rows, err := r.store.AuditTrail(ctx, r.pool, scope, key, limit)
	if err != nil {
		return nil, storeError("read audit trail", err)
	}
	out := make([]*AuditEntry, len(rows))
	for i, row := range rows {
		out[i] = &AuditEntry{Scope: row.Scope, Key: row.Key, At: row.At, Actor: row.Actor, Action: row.Action,
			Note: row.Note, Detail: row.Detail}
	}
	return out, nil
}
