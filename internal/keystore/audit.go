package keystore

import (
	"context"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
)

// The operators' audit trail (atomicphase_audit, migration 009): one row per
// action an operator took on a key. It is not the key table: forget and the
// reap leave it alone, so the trail outlives the key.

// AuditEntry is one row of the audit trail.
type AuditEntry struct {
	ID     int64
	Scope  string
	Key    string
	At     time.Time
	Actor  string
	Action string
	Note   string
	Detail []byte
}

const recordAuditSQL = `INSERT INTO /* TEMPLATE: schema */atomicphase_audit
    (scope, idempotency_key, actor, action, note, detail)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::jsonb)`

// RecordAudit appends an entry to the audit trail (its time is the
// database's).
func (s *Store) RecordAudit(ctx context.Context, db DB, e *AuditEntry) error {
	var detail any // a nil []byte would be sent as an empty string, not NULL
	if e.Detail != nil {
		detail = string(e.Detail)
	}
	_, err := db.Exec(ctx, s.sql.recordAudit, e.Scope, e.Key, e.Actor, e.Action, e.Note, detail)
	return err
}

const auditTrailSQL = `SELECT id, scope, idempotency_key AS key, at, actor, action, note, detail
FROM /* TEMPLATE: schema */atomicphase_audit
WHERE scope = $1::text AND idempotency_key = $2::text AND ($4::bigint = 0 OR id < $4::bigint)
ORDER BY id DESC
LIMIT $3::integer`

// AuditTrail reads a key's audit trail, newest first (by the primary key's
// index, backwards), at most limit entries, older than the entry before
// when it is not 0.
func (s *Store) AuditTrail(ctx context.Context, db DB, scope, key string, before int64, limit int) ([]*AuditEntry, error) {
	var rows []*AuditEntry
	err := pgxscan.Select(ctx, db, &rows, s.sql.auditTrail, scope, key, limit, before)
	return rows, err
}

// reapAuditSQL deletes the audit entries older than $1 µs. The trail has
// no index on its time (a table read by key): the sweep runs it seldom
// (atomicphase.auditReapEvery).
const reapAuditSQL = `DELETE FROM /* TEMPLATE: schema */atomicphase_audit
WHERE at < now() - $1::bigint * interval '1 microsecond'`

// ReapAudit deletes the audit entries older than olderThan and returns how
// many it deleted.
func (s *Store) ReapAudit(ctx context.Context, db DB, olderThan time.Duration) (int, error) {
	tag, err := db.Exec(ctx, Render(reapAuditSQL, s.schema), olderThan.Microseconds())
	return int(tag.RowsAffected()), err
}
