package keystore

import (
	"context"
	"net/http"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
)

// Info is a key's row as an operator reads it (the root package's KeyInfo).
type Info struct {
	Scope            string
	Key              string
	Workflow         string
	WorkflowVersion  *string // nil on keys older than versions
	RecoveryPoint    string
	RequestMethod    string
	RequestPath      string
	Fingerprint      []byte
	Status           string // see statusSQL
	Locked           bool
	LockExpiresIn    *float64
	LockToken        int64
	State            []byte
	Attempts         int
	LastError        *string
	NextAttemptAt    *time.Time
	UnknownAt        *time.Time
	ResolvedHappened *bool
	ResolvedNote     *string
	ResolvedAt       *time.Time
	ResolvedResult   []byte
	ParkedAt         *time.Time
	// ParkedForGood is set on a key parked by a permanent failure (a bug,
	// a panic), not by its attempts running out.
	ParkedForGood bool
	// Unsettled is set while the outcome of the key's foreign call is
	// unknown or a call may be in flight (see unsettledSQL).
	Unsettled bool
	// CallUntil is the end of the quiet period of a foreign call the key
	// was marked as making; nil when none was marked.
	CallUntil *time.Time
	// CalledAt is when a failed attempt knew a foreign call of the key may
	// first have gone out; nil when none did.
	CalledAt *time.Time
	// DownstreamSalt salts the key's downstream keys ("" on rows older
	// than it).
	DownstreamSalt string
	// StatusCode, Header and Body are the stored response; StatusCode is
	// nil until the key is finished.
	StatusCode *int
	Header     http.Header
	Body       []byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
}

// The statuses statusSQL computes.
const (
	StatusInProgress = "in_progress"
	StatusStale      = "stale"
	StatusAbandoned  = "abandoned"
	StatusUnknown    = "unknown"
	StatusParked     = "parked"
	StatusFinished   = "finished"
)

// statusSQL computes a key's status in SQL ($3 is the lock timeout in µs,
// which judges only rows whose lease an older release wrote without its
// length).
const statusSQL = `CASE status
    WHEN 'f' THEN 'finished'
    WHEN 'p' THEN 'parked'
    WHEN 'u' THEN 'unknown'
    WHEN 'w' THEN CASE WHEN call_until >= now() THEN 'in_progress' ELSE 'abandoned' END
    ELSE CASE WHEN /* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $3) < now() THEN 'stale'
              ELSE 'in_progress' END END`

// unsettledSQL is true while an unfinished key may have paid: the outcome
// of its foreign call is unknown (unknown_at, cleared only by the
// checkpoint that records the call's result), a call it was marked as
// making may still be acted on by the downstream (call_until, the lease's
// end plus the call grace, not yet past), or a failed attempt knew that a
// foreign call of it may have gone out (called_at: a call sent, a foreign
// phase committed). Forgetting or reaping such a key would let a retry
// record it anew, with a new downstream salt, and pay again: Forget and
// ReapParked leave it alone. A finished key is settled: its answer is
// stored.
const unsettledSQL = `(response_status IS NULL AND (unknown_at IS NOT NULL OR called_at IS NOT NULL OR coalesce(call_until >= now(), false)))`

// infoColumns are the columns an Info is scanned from.
const infoColumns = `scope, idempotency_key AS key, workflow, workflow_version, recovery_point,
       request_method, request_path, fingerprint,
       ` + statusSQL + ` AS status,
       locked_at IS NOT NULL AS locked, lock_token, state, attempts, last_error,
       next_attempt_at, parked_at, coalesce(final_parked_at = parked_at, false) AS parked_for_good, unknown_at, ` + unsettledSQL + ` AS unsettled, call_until, called_at, coalesce(downstream_salt::text, '') AS downstream_salt, resolved_happened, resolved_note, resolved_at, resolved_result,
       extract(epoch FROM /* TEMPLATE: schema */atomicphase_lock_expires(locked_at, lease_us, call_until, $3, now()) - now())::float8 AS lock_expires_in,
       response_status AS status_code, response_header AS header, response_body AS body,
       created_at, updated_at, finished_at`

// pageColumns are infoColumns as a page of keys reads them: when $12 is
// true (brief), the columns no list shows and a client can make large
// (the state, the stored response's header and body, the request's path,
// the verdict's note and result) are read as empty. The last error is
// bounded where it is written (MaxLastError). A brief page then takes
// memory that follows its length, not what the keys' rows hold.
const pageColumns = `scope, idempotency_key AS key, workflow, workflow_version, recovery_point,
       request_method, CASE WHEN $12::boolean THEN '' ELSE request_path END AS request_path, fingerprint,
       ` + statusSQL + ` AS status,
       locked_at IS NOT NULL AS locked, lock_token, CASE WHEN $12::boolean THEN NULL ELSE state END AS state, attempts, last_error,
       next_attempt_at, parked_at, coalesce(final_parked_at = parked_at, false) AS parked_for_good, unknown_at, ` + unsettledSQL + ` AS unsettled, call_until, coalesce(downstream_salt::text, '') AS downstream_salt, resolved_happened,
       CASE WHEN $12::boolean THEN NULL ELSE resolved_note END AS resolved_note, resolved_at,
       CASE WHEN $12::boolean THEN NULL ELSE resolved_result END AS resolved_result,
       extract(epoch FROM /* TEMPLATE: schema */atomicphase_lock_expires(locked_at, lease_us, call_until, $3, now()) - now())::float8 AS lock_expires_in,
       response_status AS status_code, CASE WHEN $12::boolean THEN NULL ELSE response_header END AS header,
       CASE WHEN $12::boolean THEN NULL ELSE response_body END AS body,
       created_at, updated_at, finished_at`

// briefColumns are pageColumns always brief.
const briefColumns = `scope, idempotency_key AS key, workflow, workflow_version, recovery_point,
       request_method, '' AS request_path, fingerprint,
       ` + statusSQL + ` AS status,
       locked_at IS NOT NULL AS locked, lock_token, NULL::bytea AS state, attempts, last_error,
       next_attempt_at, parked_at, unknown_at, ` + unsettledSQL + ` AS unsettled, call_until, coalesce(downstream_salt::text, '') AS downstream_salt, resolved_happened,
       NULL::text AS resolved_note, resolved_at, NULL::jsonb AS resolved_result,
       extract(epoch FROM /* TEMPLATE: schema */atomicphase_lock_expires(locked_at, lease_us, call_until, $3, now()) - now())::float8 AS lock_expires_in,
       response_status AS status_code, NULL::jsonb AS header, NULL::bytea AS body,
       created_at, updated_at, finished_at`

const inspectSQL = `SELECT ` + infoColumns + `
FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1 AND idempotency_key = $2`

// Inspect reads a key's row without locking or changing it; nil when the
// key does not exist.
func (s *Store) Inspect(ctx context.Context, db DB, scope, key string) (*Info, error) {
	var info Info
	err := pgxscan.Get(ctx, db, &info, s.sql.inspect, scope, key, s.lockTimeoutUS)
	if pgxscan.NotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}

// Filter selects keys for List; empty fields select any.
type Filter struct {
	Status, Workflow, Scope string
	// OlderThan keeps keys created longer ago than this.
	OlderThan time.Duration
	// Limit is the most keys returned, oldest first.
	Limit int
	// ErrorContains keeps keys whose last error contains it.
	ErrorContains string
}

const listKeysSQL = `SELECT * FROM (SELECT ` + infoColumns + `
    FROM /* TEMPLATE: schema */idempotency_keys
    WHERE ($1 = '' OR workflow = $1) AND ($2 = '' OR scope = $2)
      AND created_at < now() - $4 * interval '1 microsecond') AS k
WHERE ($5 = '' OR k.status = $5) AND ($7 = '' OR strpos(k.last_error, $7) > 0)
ORDER BY created_at, scope, key
LIMIT $6`

// List lists the keys f selects, oldest first. It reads every shard of a
// distributed key table: it is for operators, never on a request's path.
func (s *Store) List(ctx context.Context, db DB, f *Filter) ([]*Info, error) {
	var rows []*Info
	err := pgxscan.Select(ctx, db, &rows, s.sql.list,
		f.Workflow, f.Scope, s.lockTimeoutUS, max(f.OlderThan, 0).Microseconds(), f.Status, f.Limit, f.ErrorContains)
	return rows, err
}
