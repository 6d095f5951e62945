// Package keystore is the one home of the key table's SQL: every statement
// the library sends to idempotency_keys and its functions, the types its
// rows are scanned into, and the rules that keep the statements
// Citus-compatible. The engine (the root package) speaks to the table only
// through it, in its own terms: peek, acquire, record, take, checkpoint,
// release, inspect, list, unpark, forget, resolve, sweep and reap.
//
// The statements are written with schemaMarker before every table and
// function name and rendered once for the configured schema (New). Each
// one's casts name every parameter's type, so it resolves the same in every
// pgx query exec mode (behind PgBouncer, say), where parameter types are not
// described by the server. Every statement on a request's path is keyed by
// scope, the table's distribution column on Citus; the few that read every
// shard are the operator's and the sweep's (see citus_test.go). The PL/pgSQL
// functions they call are in the migrations (schema.sql shows the newest of
// each).
package keystore

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is the key table's name, unqualified: what a user's tables are
// colocated with on Citus.
const Table = "idempotency_keys"

// DB is what a statement runs on: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// schemaMarker stands before every table and function name in the
// migrations and the statements here; Render replaces it with the
// configured schema.
const schemaMarker = "/* TEMPLATE: schema */"

// Render qualifies the names in sql with schema ("" leaves them to the
// search_path).
func Render(sql, schema string) string {
	return strings.ReplaceAll(sql, schemaMarker, Qualifier(schema))
}

// Qualifier is what goes before a table or function name for schema: ""
// for the search_path, else the quoted schema name and a dot.
func Qualifier(schema string) string {
	if schema == "" {
		return ""
	}
	return pgx.Identifier{schema}.Sanitize() + "."
}

// Store is the key table of one schema, seen with one lock timeout. It
// holds no connection: every method runs on the DB it is given.
type Store struct {
	schema string
	// lockTimeoutUS is the lock timeout in microseconds, and
	// lockTimeoutArg the same boxed once, for the statements on the hot
	// path that take it.
	lockTimeoutUS  int64
	lockTimeoutArg any
	sql            statements
	// recordFirstName is atomicphase_record_first's signature in this
	// schema, for Features.
	recordFirstName string
	// plain is set once the database is known to be one PostgreSQL (not
	// Citus): a request's own writes of its key are then plain statements
	// (plain.go) rather than the functions of the same names.
	plain atomic.Bool
}

// SetPlain says whether the database is one PostgreSQL, whose key writes on
// a request's path are plain statements (plain.go), or Citus (or not known
// yet), where the functions stand in for them.
func (s *Store) SetPlain(plain bool) { s.plain.Store(plain) }

// Plain reports what SetPlain said last.
func (s *Store) Plain() bool { return s.plain.Load() }

// statements are the statements rendered once for the Store's schema.
type statements struct {
	acquire, peek, peekAssumed, record, ownedBy, take, renew, release, checkpoint, clearLastError, takeVerdict,
	inspect, list, unpark, forgetRead, forget, recordResolution,
	abandoned, unknownWorkflows, reapPick, reapOne, reapParkedPick, reapParkedOne,
	levels, recentTrouble, page, pageUnfinished, scopeKeys,
	recordAudit, auditTrail, history,
	versionOf, announce, versionDrained, reclaimVersion, deployed, otherVersions, versionKeys, versions, undoAttempt,
	claim, recordUnit, recordFirst,
	watermark, planWatermark, passed, markPassed, moveWatermark,
	plainRecordFirst, plainRecordUnit, plainClaim, plainCheckpoint, plainRenew, keyEvent string
}

// New returns the Store for schema ("" for the search_path) and lockTimeout.
func New(schema string, lockTimeout time.Duration) *Store {
	r := func(sql string) string { return Render(sql, schema) }
	us := lockTimeout.Microseconds()
	return &Store{schema: schema, lockTimeoutUS: us, lockTimeoutArg: us, recordFirstName: r(recordFirstFunction) + recordFirstArgs, sql: statements{
		acquire:          r(acquireSQL),
		peek:             r(peekSQL),
		peekAssumed:      r(peekAssumedSQL),
		record:           r(recordSQL),
		ownedBy:          r(ownedBySQL),
		take:             r(takeSQL),
		renew:            r(renewSQL),
		release:          r(releaseSQL),
		checkpoint:       r(checkpointSQL),
		clearLastError:   r(clearLastErrorSQL),
		takeVerdict:      r(takeVerdictSQL),
		inspect:          r(inspectSQL),
		list:             r(listKeysSQL),
		unpark:           r(unparkSQL),
		forgetRead:       r(forgetReadSQL),
		forget:           r(forgetSQL),
		recordResolution: r(recordResolutionSQL),
		abandoned:        r(abandonedSQL),
		unknownWorkflows: r(unknownSQL),
		reapPick:         r(reapPickSQL),
		reapOne:          r(reapOneSQL),
		reapParkedPick:   r(reapParkedPickSQL),
		reapParkedOne:    r(reapParkedOneSQL),
		levels:           r(levelsSQL),
		recentTrouble:    r(recentTroubleSQL),
		page:             r(pageSQL),
		pageUnfinished:   r(pageUnfinishedSQL),
		scopeKeys:        r(scopeKeysSQL),
		recordAudit:      r(recordAuditSQL),
		auditTrail:       r(auditTrailSQL),
		history:          r(historySQL),
		versionOf:        r(versionOfSQL),
		announce:         r(announceSQL),
		versionDrained:   r(versionDrainedSQL),
		reclaimVersion:   r(reclaimVersionSQL),
		deployed:         r(deployedSQL),
		otherVersions:    r(otherVersionsSQL),
		versionKeys:      r(versionKeysSQL),
		versions:         r(versionsSQL),
		undoAttempt:      r(undoAttemptSQL),
		claim:            r(claimSQL),
		recordUnit:       r(recordUnitSQL),
		recordFirst:      r(recordFirstSQL),
		watermark:        r(watermarkSQL),
		planWatermark:    r(planWatermarkSQL),
		passed:           r(passedSQL),
		markPassed:       r(markPassedSQL),
		moveWatermark:    r(moveWatermarkSQL),
		plainRecordFirst: r(plainRecordFirstSQL),
		plainRecordUnit:  r(plainRecordUnitSQL),
		plainClaim:       r(plainClaimSQL),
		plainCheckpoint:  r(plainCheckpointSQL),
		plainRenew:       r(plainRenewSQL),
		keyEvent:         r(keyEventSQL),
	}}
}

// LockTimeout is the lock timeout the Store was made with.
func (s *Store) LockTimeout() time.Duration {
	return time.Duration(s.lockTimeoutUS) * time.Microsecond
}

// featuresSQL tells whether the database runs Citus, and whether
// atomicphase_record_first (migration 020), named by $1, exists. It reads
// the catalog only, not the key table.
const featuresSQL = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'),
       to_regprocedure($1) IS NOT NULL`

// recordFirstFunction and recordFirstArgs name atomicphase_record_first
// and its argument types, for to_regprocedure.
const (
	recordFirstFunction = `/* TEMPLATE: schema */atomicphase_record_first`
	recordFirstArgs     = `(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)`
)

// Features reports what the database db reaches offers the request path.
//
// citus: the database runs Citus. There, the statements of one batch sent
// without BEGIN are not one transaction: each commits on its own when it
// touches a distributed table (on one PostgreSQL the batch's implicit
// transaction commits them together, or none), so a unit's statements
// must always be sent inside BEGIN and COMMIT.
//
// recordFirst: migration 020 is applied, and a new key's first unit sent
// whole may record the key at its head (Recording.QueueRecord). On Citus,
// only once atomicphase_record_first is distributed with force_delegation,
// as Migrate distributes it: the unit's transaction then runs it on the
// worker of the key's shard, where it takes the claim's advisory lock, as
// atomicphase_claim (a previous release's) does. Run on the coordinator
// instead, it would take that lock where no claim looks for it.
func (s *Store) Features(ctx context.Context, db DB) (citus, recordFirst bool, err error) {
	if err = db.QueryRow(ctx, featuresSQL, s.recordFirstName).Scan(&citus, &recordFirst); err != nil || !citus || !recordFirst {
		return citus, recordFirst, err
	}
	if err = db.QueryRow(ctx, delegatedSQL, s.recordFirstName).Scan(&recordFirst); err != nil {
		recordFirst = false
	}
	return citus, recordFirst, err
}

// delegatedSQL tells, on Citus, whether the function named by $1 is
// distributed with force_delegation.
const delegatedSQL = `SELECT coalesce((SELECT o.force_delegation FROM pg_catalog.pg_dist_object o
    WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.objid = to_regprocedure($1)::oid), false)`
