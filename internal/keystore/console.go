package keystore

import (
	"context"
	"errors"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
)

// The console's statements: the levels of unfinished keys, the recent parks
// and unknown outcomes, and a page of keys after a cursor. All of them read
// every shard of a distributed key table (they are for operators, never on
// a request's path). None counts the table or skips with an offset: the
// levels and the recent trouble read the unfinished keys only, and a page
// is a range of the index on created_at after its cursor.

// Level is how many unfinished keys of a workflow have a status, and when
// the oldest of them was created.
type Level struct {
	Workflow string
	Status   string
	Count    int64
	Oldest   time.Time
}

// unfinishedKeys is the key table's unfinished keys, read with no index on
// all of them (one would cost every request an entry, and its finish the
// HOT update): the unparked keys that went wrong (next_attempt_at set: the
// index of keys the sweep reads), the parked ones (the index of parked
// keys), and the keys created since the sweep's watermark that neither
// went wrong nor parked (the index on created_at): a key created
// before the watermark is marked when still unfinished (sweep.go). Each
// unfinished key is in one of the three, once.
const unfinishedKeys = `(
    SELECT * FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND next_attempt_at IS NOT NULL AND parked_at IS NULL
    UNION ALL
    SELECT * FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NOT NULL
    UNION ALL
    SELECT * FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND next_attempt_at IS NULL AND parked_at IS NULL
      AND created_at >= coalesce((SELECT created_before FROM /* TEMPLATE: schema */atomicphase_sweep_watermark
                                  WHERE name = 'abandoned'), '-infinity'))`

// levelsSQL counts the unfinished keys by workflow and status ($1 and $2
// narrow it to a workflow and a scope; $3 is the lock timeout in µs).
const levelsSQL = `SELECT workflow, status, count(*)::bigint AS count, min(created_at) AS oldest FROM (
    SELECT workflow, created_at, ` + statusSQL + ` AS status
    FROM ` + unfinishedKeys + ` AS u
    WHERE ($1::text = '' OR workflow = $1::text) AND ($2::text = '' OR scope = $2::text)) AS k
GROUP BY workflow, status
ORDER BY workflow, status`

// Levels counts the unfinished keys by workflow and status, optionally of
// one workflow or one scope only.
func (s *Store) Levels(ctx context.Context, db DB, workflow, scope string) ([]Level, error) {
	var rows []Level
	err := pgxscan.Select(ctx, db, &rows, s.sql.levels, workflow, scope, s.lockTimeoutUS)
	return rows, err
}

// estimateSQL reads the planner's estimate of the key table's rows: what
// the console shows for the finished keys, rather than counting them.
// reltuples is -1 until the table is first analysed (PostgreSQL 14 on).
const estimateSQL = `SELECT coalesce((SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1::text)), -1)`

// Estimate is the planner's estimate of the key table's rows, or -1 before
// the table was first analysed.
func (s *Store) Estimate(ctx context.Context, db DB) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, estimateSQL, qualifiedName(s.schema, Table)).Scan(&n)
	return n, err
}

// recentTroubleSQL lists the unfinished keys most recently parked or left
// with an unknown outcome, newest first, as a list shows them
// (pageColumns): each went wrong or is parked (unfinishedKeys' first two
// parts; an unknown outcome's release sets the key's next attempt).
const recentTroubleSQL = `SELECT ` + briefColumns + `
FROM (
    SELECT * FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND next_attempt_at IS NOT NULL AND parked_at IS NULL AND unknown_at IS NOT NULL
    UNION ALL
    SELECT * FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NOT NULL) AS u
WHERE ($1::text = '' OR workflow = $1::text) AND ($2::text = '' OR scope = $2::text)
ORDER BY greatest(parked_at, unknown_at) DESC
LIMIT $4::integer`

// RecentTrouble lists the limit unfinished keys most recently parked or
// left with an unknown outcome, newest first.
func (s *Store) RecentTrouble(ctx context.Context, db DB, workflow, scope string, limit int) ([]*Info, error) {
	var rows []*Info
	err := pgxscan.Select(ctx, db, &rows, s.sql.recentTrouble, workflow, scope, s.lockTimeoutUS, limit)
	return rows, err
}

// Cursor is where a page of keys ends: the next page starts after it, in
// the order (created_at, scope, key).
type Cursor struct {
	CreatedAt  time.Time
	Scope, Key string
}

// PageFilter selects a page of keys; empty fields select any.
type PageFilter struct {
	Filter
	// ErrorContains keeps keys whose last error contains it, in any case.
	ErrorContains string
	// Key keeps the key of this client key (in any scope, unless Scope is
	// set too).
	Key string
	// After starts the page after this key; nil for the first page.
	After *Cursor
	// Brief reads the keys as a list shows them (pageColumns).
	Brief bool
}

// pageWhere is the page's condition, shared by its two forms.
const pageWhere = `
    WHERE ($1::text = '' OR workflow = $1::text) AND ($2::text = '' OR scope = $2::text)
      AND created_at < now() - $4::bigint * interval '1 microsecond'
      AND ($7::text = '' OR strpos(lower(last_error), lower($7::text)) > 0)
      AND ($8::text = '' OR idempotency_key = $8::text)
      AND ($9::timestamptz IS NULL OR (created_at, scope, idempotency_key) > ($9::timestamptz, $10::text, $11::text))`

// pageSQL lists a page of keys of any status in the order (created_at,
// scope, key), after a cursor: each page is a range scan of the index on
// created_at, however deep it is. $12 reads them brief (pageColumns).
const pageSQL = `SELECT * FROM (SELECT ` + pageColumns + `
    FROM /* TEMPLATE: schema */idempotency_keys` + pageWhere + `
    ORDER BY created_at, scope, idempotency_key) AS k
WHERE ($5::text = '' OR k.status = $5::text)
ORDER BY created_at, scope, key
LIMIT $6::integer`

// pageUnfinishedSQL is pageSQL for an unfinished status: it reads the
// unfinished keys only (unfinishedKeys), not the table.
const pageUnfinishedSQL = `SELECT * FROM (SELECT ` + pageColumns + `
    FROM ` + unfinishedKeys + ` AS u` + pageWhere + `
    ORDER BY created_at, scope, idempotency_key) AS k
WHERE ($5::text = '' OR k.status = $5::text)
ORDER BY created_at, scope, key
LIMIT $6::integer`

// Page lists the keys f selects after f.After, oldest first, at most
// f.Limit of them.
func (s *Store) Page(ctx context.Context, db DB, f *PageFilter) ([]*Info, error) {
	sql := s.sql.page
	if f.Status != "" && f.Status != StatusFinished {
		sql = s.sql.pageUnfinished
	}
	var at *time.Time
	var afterScope, afterKey string
	if f.After != nil {
		at, afterScope, afterKey = &f.After.CreatedAt, f.After.Scope, f.After.Key
	}
	var rows []*Info
	err := pgxscan.Select(ctx, db, &rows, sql,
		f.Workflow, f.Scope, s.lockTimeoutUS, max(f.OlderThan, 0).Microseconds(), f.Status, f.Limit,
		f.ErrorContains, f.Key, at, afterScope, afterKey, f.Brief)
	return rows, err
}

// scopeKeysSQL lists a scope's keys with what their downstream keys are
// derived from, newest first: a range of the primary key's index, for the
// reverse lookup from a downstream reference, which hashes them.
const scopeKeysSQL = `SELECT idempotency_key, workflow, coalesce(downstream_salt::text, '')
FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1::text
ORDER BY created_at DESC`

// ScopeKey is a key of a scope with what its downstream keys are derived
// from.
type ScopeKey struct {
	Key, Workflow, Salt string
}

// EachScopeKey calls fn with every key of scope, newest first, until fn
// returns false.
func (s *Store) EachScopeKey(ctx context.Context, db DB, scope string, fn func(ScopeKey) bool) error {
	rows, err := db.Query(ctx, s.sql.scopeKeys, scope)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k ScopeKey
		if err := rows.Scan(&k.Key, &k.Workflow, &k.Salt); err != nil {
			return err
		}
		if !fn(k) {
			break
		}
	}
	rows.Close()
	return rows.Err()
}

// recordedPhasesSQL reads the phases the processes that ran a workflow
// version recorded (migration 011), however long ago: what a console that
// has not the workflow's code knows of it. One row of the registry's
// primary key.
const recordedPhasesSQL = `SELECT phases FROM /* TEMPLATE: schema */atomicphase_workflow_versions
WHERE workflow = $1::text AND version = $2::text`

// RecordedPhases returns the phases recorded for version of workflow
// (former names included, each after its phase), and false when no
// process recorded that version.
func (s *Store) RecordedPhases(ctx context.Context, db DB, workflow, version string) ([]string, bool, error) {
	var phases []string
	err := db.QueryRow(ctx, Render(recordedPhasesSQL, s.schema), workflow, version).Scan(&phases)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return phases, err == nil, err
}
