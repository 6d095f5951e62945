package keystore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The key's lock, as the table keeps it: a lease. A key is held until
// locked_at + lease_us (the lease, which its holder renews), or until
// call_until when that is later (a foreign call may be in flight); an
// unfinished key past both may be taken by the next attempt. Every
// acquisition stores a lock token of its own, drawn by the caller before it
// asks, and every checkpoint, renewal and release checks it (fencing). The
// rule is written once, in SQL: atomicphase_held_until (migration 007).

// Row is what an acquisition reads back about a key.
type Row struct {
	// Acquired is true when this statement took the lock.
	Acquired       bool
	Workflow       string
	Fingerprint    []byte
	RecoveryPoint  string
	JumpTarget     *string // the phase to run next when the last one jumped
	State          []byte
	LockToken      int64
	LockExpiresIn  *float64 // seconds until a live lock goes stale
	DownstreamSalt *string  // salts the row's downstream keys; nil on rows older than migration 003
	Attempts       int      // acquisitions of the key so far, this one included
	TookOver       bool     // this acquisition took a stale lock
	OverLimit      bool     // a new key refused: its scope has too many unfinished keys
	Parked         bool     // a parked key refused: a client's retry does not run it again
	// Unheld is set when no live lease holds the key, only a foreign
	// call's mark (its quiet period) or its reconciliation's backoff:
	// nobody will finish it before LockExpiresIn, so a retry is pointless
	// before then. Peek and Acquire set it.
	Unheld         bool
	ResponseStatus *int
	ResponseHeader []byte // JSON text, decoded only for a replay
	ResponseBody   []byte
	// WorkflowVersion is the version of the workflow definition the key
	// started under; nil for a key recorded without one (by a release
	// older than versions), or not read (a refusal).
	WorkflowVersion *string
}

// acquireSQL records or takes the key, or reports why not, in one statement
// and one round trip (see atomicphase_admit and atomicphase_acquire in
// schema.sql). A replay, and a parked key, read the row by primary key and
// write nothing.
const acquireSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_admit(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bytea, $8::bigint, $9::bigint, $10::integer, $11::text)`

// Request is what a request's recording and acquisition store of it.
type Request struct {
	Scope, Key, Workflow string
	Fingerprint          []byte
	Method, Path         string
	// State is the initial state, stored when the key is new.
	State []byte
	// Token is the lock token the acquisition stores.
	Token int64
	// MaxUnfinished refuses a new key whose scope has this many unfinished
	// keys already; nil for no limit.
	MaxUnfinished *int32
	// Version is the version of the workflow definition a new key records.
	Version string
	// Args are Scope, Key, Fingerprint and Token boxed once (KeyArgs), for
	// the recording's statements; the zero KeyArgs boxes them on use.
	Args KeyArgs
}

// KeyArgs are a request's key as statement arguments, each boxed once.
// pgx takes a statement's arguments as []any, and a string, a byte slice
// or an int64 put in an interface is a heap allocation every time it is: a
// new key's scope and key go into four statements (its read, the claim,
// the recording and the last checkpoint), its fingerprint and its lock
// token into two each. The zero KeyArgs boxes on every use.
type KeyArgs struct {
	Scope, Key, Fingerprint any
	// Token is nil until the attempt has its lock token.
	Token any
	// Workflow and Version are the workflow's name and version, boxed
	// once per workflow; nil to box them on use.
	Workflow, Version any
}

// NewKeyArgs boxes a request's scope, key and fingerprint.
func NewKeyArgs(scope, key string, fingerprint []byte) KeyArgs {
	return KeyArgs{Scope: scope, Key: key, Fingerprint: fingerprint}
}

// scopeKey returns the boxed scope and key, or scope and key boxed now.
func (ka *KeyArgs) scopeKey(scope, key string) (any, any) {
	if ka.Scope != nil {
		return ka.Scope, ka.Key
	}
	return scope, key
}

// token returns the boxed token, or token boxed now.
func (ka *KeyArgs) token(token int64) any {
	if ka.Token != nil {
		return ka.Token
	}
	return token
}

// workflow returns the boxed workflow name, or name boxed now.
func (ka *KeyArgs) workflow(name string) any {
	if ka.Workflow != nil {
		return ka.Workflow
	}
	return name
}

// version returns the boxed workflow version, or version boxed now.
func (ka *KeyArgs) version(version string) any {
	if ka.Version != nil {
		return ka.Version
	}
	return version
}

// fingerprint returns the boxed fingerprint, or fingerprint boxed now.
func (ka *KeyArgs) fingerprint(fingerprint []byte) any {
	if ka.Fingerprint != nil {
		return ka.Fingerprint
	}
	return fingerprint
}

// Acquire records req's key, or takes it when it is unfinished and nobody
// holds it, or reports why not (Row.Acquired false: a finished key's stored
// response, a key used with another request, a live lock, a scope over its
// limit, a parked key), in one statement. It scans positionally: it is the hot path of
// every request.
func (s *Store) Acquire(ctx context.Context, db DB, req *Request) (*Row, error) {
	var row Row
	err := db.QueryRow(ctx, s.sql.acquire,
		req.Scope, req.Key, req.Workflow, req.Fingerprint, req.Method, req.Path, req.State, s.lockTimeoutUS, req.Token,
		req.MaxUnfinished, req.Version,
	).Scan(&row.Acquired, &row.Workflow, &row.Fingerprint, &row.RecoveryPoint, &row.JumpTarget,
		&row.State, &row.LockToken, &row.LockExpiresIn, &row.DownstreamSalt,
		&row.Attempts, &row.TookOver, &row.OverLimit,
		&row.ResponseStatus, &row.ResponseHeader, &row.ResponseBody, &row.Parked, &row.WorkflowVersion)
	if err != nil {
		return nil, err
	}
	if !row.Acquired {
		// On a refusal, took_over says no live lease holds the key
		// (atomicphase_acquire, migration 016).
		row.Unheld, row.TookOver = row.TookOver, false
	}
	return &row, nil
}

// peekSQL reads what a request needs to know about its key before it
// runs: whether the key exists, and when it does, whether it was used with
// another request, its stored response, and whether a live attempt holds
// it. It is the whole of a replay: one primary-key read, written to nothing.
const peekSQL = `/* atomicphase: read the key */
SELECT workflow = $4::text AND fingerprint = $5::bytea, response_status, response_header::text, response_body,
       (date_part('epoch', locked_at) * 1000000::float8)::int8, coalesce(lease_us, $3::bigint),
       (date_part('epoch', call_until) * 1000000::float8)::int8, (date_part('epoch', now()) * 1000000::float8)::int8,
       coalesce(final_parked_at = parked_at, false)
FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1 AND idempotency_key = $2`

// peekAssumedSQL is peekSQL for a batch that assumes its key is new
// (Recording.Assume), ahead of the key's recording: the key's row, if
// any, and then, for a key that exists, the claim (atomicphase_claim),
// which refuses it (RecordedMeanwhileCode, or RecordingInFlightCode while
// another transaction holds the claim's lock) and so ends the batch there,
// after the row was sent. A replay's batch then runs neither the
// recording nor the unit, and takes no transaction id (the recording takes
// one before the key's times, for the sweep's watermark). The second
// branch never returns a row (a void IS NULL is false): its filter is
// there to run the claim. For a new key the claim is never called: it is
// a filter on the rows the primary key's index condition returns (and,
// in a sequential scan, the costliest test, evaluated last), and the
// claim is volatile and parallel unsafe, so the plan is a plain Append,
// which runs its branches in order. Not sent on Citus, where no batch
// assumes (Features).
const peekAssumedSQL = peekSQL + `
UNION ALL
SELECT workflow = $4::text AND fingerprint = $5::bytea, response_status, response_header::text, response_body,
       (date_part('epoch', locked_at) * 1000000::float8)::int8, coalesce(lease_us, $3::bigint),
       (date_part('epoch', call_until) * 1000000::float8)::int8, (date_part('epoch', now()) * 1000000::float8)::int8,
       coalesce(final_parked_at = parked_at, false)
FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1 AND idempotency_key = $2 AND /* TEMPLATE: schema */atomicphase_claim($1::text, $2::text) IS NULL`

// aheadRow is the first row of peekAssumedSQL, and, in err, the claim's
// refusal that followed it (pgx's QueryRow would answer the refusal
// alone, and lose the row).
type aheadRow struct {
	rows pgx.Rows
	err  error
}

// Scan scans the first row (pgx.ErrNoRows when there is none, or the
// read's own error) and reads the rest, keeping its error in r.err.
func (r *aheadRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	r.err = r.rows.Err()
	return nil
}

// Peeked is what Peek read about an existing key.
type Peeked struct {
	Row
	// Same is true when the key was recorded for this workflow and a
	// request with this fingerprint (compared by the server, so neither
	// travels back).
	Same bool
	// Takeable is true when nobody holds the key (or its lock is stale).
	Takeable bool
	// (Row.Parked is true for a key parked for good, by a permanent
	// failure: a retry is answered at once, whatever call mark is left.)
}

// Peek reads a request's key, given as NewKeyArgs made it (its scope, key
// and fingerprint boxed). found is false when the key does not exist.
//
// It is the whole of a replay, so it scans into one value (one allocation
// for every target and the pointers it returns into), and passes the lock
// timeout boxed once.
func (s *Store) Peek(ctx context.Context, db DB, key KeyArgs, workflow string) (p Peeked, found bool, err error) {
	return scanPeeked(db.QueryRow(ctx, s.sql.peek, key.Scope, key.Key, s.lockTimeoutArg, key.workflow(workflow), key.Fingerprint))
}

// scanPeeked scans peekSQL's answer.
func scanPeeked(row pgx.Row) (p Peeked, found bool, err error) {
	var sc struct {
		p                   Peeked
		status              pgtype.Int4
		lockedAt, callUntil pgtype.Int8
		now                 pgtype.Int8
		leaseUs             int64
		expiresIn           float64
		st                  int
	}
	err = row.Scan(&sc.p.Same, &sc.status, &sc.p.ResponseHeader, &sc.p.ResponseBody,
		&sc.lockedAt, &sc.leaseUs, &sc.callUntil, &sc.now, &sc.p.Parked)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	if sc.status.Valid {
		sc.st = int(sc.status.Int32)
		sc.p.ResponseStatus = &sc.st
	}
	var l leaseJudgement
	l.judge(microsTime(sc.lockedAt), sc.leaseUs, microsTime(sc.callUntil), microsTime(sc.now).Time)
	sc.p.Takeable = l.takeable
	if l.expires {
		sc.expiresIn = l.expiresIn
		sc.p.LockExpiresIn = &sc.expiresIn
	}
	sc.p.Unheld = !sc.p.Takeable && !l.live
	return sc.p, true, nil
}

// recordSQL records a new key, locked under the caller's lock token, inside
// the transaction of the workflow's first phase (phase fusion): the key
// and the phase's writes commit together. It records nothing when the key
// exists, having waited for an attempt recording it at the same moment to
// commit or roll back; the caller then acquires the key on its own
// (acquireSQL). See atomicphase_record in schema.sql: the function takes the
// lock time on the node that holds the row.
//
// It never waits for another transaction recording the same key (a
// duplicate of a new key, sent while the first request's transaction runs):
// it raises RecordingInFlightCode at once, and the rest of the batch is
// skipped.
const recordSQL = `SELECT downstream_salt::text FROM /* TEMPLATE: schema */atomicphase_record(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bytea, $8::bigint, NULL::integer, $9::bigint, $10::text)`

// claimSQL claims a new key for the transaction that will record it: the
// advisory lock a recording holds (see atomicphase_claim), raising
// RecordingInFlightCode when another transaction holds it.
const claimSQL = `SELECT /* TEMPLATE: schema */atomicphase_claim($1::text, $2::text)`

// recordUnitSQL records a new key at the commit of its first unit, with the
// unit's checkpoint (see atomicphase_record_unit): the row is written once.
const recordUnitSQL = `SELECT downstream_salt::text FROM /* TEMPLATE: schema */atomicphase_record_unit(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bigint, $8::bigint, $9::text,
	$10::text, $11::text, $12::bytea, $13::integer, $14::jsonb, $15::bytea)`

// recordFirstSQL records a new key at the head of its first unit's batch
// (see atomicphase_record_first, migration 020): the claim's lock and the
// insert, with the unit's checkpoint, in one statement.
const recordFirstSQL = `SELECT downstream_salt::text FROM /* TEMPLATE: schema */atomicphase_record_first(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bigint, $8::bigint, $9::text,
	$10::text, $11::text, $12::bytea, $13::integer, $14::jsonb, $15::bytea)`

// RecordedMeanwhileCode is the SQLSTATE atomicphase_record_unit raises when
// the key exists.
const RecordedMeanwhileCode = "AP003"

// Recording is a new key's recording: claimed at the head of the first
// unit's transaction (Queue, Read), inserted with the unit's checkpoint at
// its commit (Final, ReadFinal), or both at once at the head of a unit
// sent whole (QueueRecord, Read), or sent again on its own (RecordAgain)
// when that transaction did not commit.
type Recording struct {
	sql string
	// claim and final are the claim's and the final insert's statements;
	// recordFirst is the final insert that takes the claim's lock itself
	// (QueueRecord).
	claim, final, recordFirst string
	req                       *Request
	lease                     any
	// peek is set for a recording that assumes its key is new (Assume):
	// the key's read travels ahead of the claim, in the same batch
	// (peekAssumedSQL), or, before a transaction block, on its own
	// (peekAlone: ReadAhead).
	peek, peekAlone string
	// Found is what the read ahead of the claim found when the key
	// existed (the claim then refused it): all a replay or a refusal
	// needs, in the round trip that was to record the key.
	Found *Peeked
	// Sent and Recorded say how its latest sending went: Sent is set once
	// the server answered the claim (or the insert that went in its place,
	// QueueRecord), Recorded when that answer was that the key is ours to
	// record (false: the key existed, or another request was recording
	// it, or that insert's function is missing).
	Sent, Recorded bool
	// Announced is set by the caller once the key's creation was reported.
	Announced bool
	// Salt is the new row's downstream salt.
	Salt string
	// first is set when the recording went at the head of its unit's only
	// batch, as the final insert itself (QueueRecord), with no claim.
	first bool
	// ahead reads the key's read ahead of the claim (Read), kept here so
	// that reading it allocates nothing.
	ahead aheadRow
	// aheadFailed is set when the batch failed at the key's read ahead of
	// the claim with an error that says nothing of the key (Resolve).
	aheadFailed bool
}

// ErrRecordFirstMissing is a recording's answer when it went at the head
// of its unit (QueueRecord) on a database without migration 020: the
// batch did nothing, and the caller stops recording keys that way until
// Store.Features finds the function again.
var ErrRecordFirstMissing = errors.New("atomicphase: atomicphase_record_first does not exist")

// StoreMissingError is a recording's answer when the key's read ahead of
// it found no key table, or no function of it: the schema is missing, or
// older than the code (nothing of the batch ran).
type StoreMissingError struct{ Err error }

func (e *StoreMissingError) Error() string { return e.Err.Error() }
func (e *StoreMissingError) Unwrap() error { return e.Err }

// ErrNotRecorded is a recording's answer when the key existed: the attempt
// ran on the assumption of a new key, and the key is acquired on its own
// instead.
var ErrNotRecorded = errors.New("atomicphase: the key was recorded meanwhile")

// NewRecording makes the recording of req's key (req.MaxUnfinished is not
// applied: a recording that rides in a transaction is not counted).
func (s *Store) NewRecording(req *Request) *Recording {
	if s.plain.Load() {
		return &Recording{sql: s.sql.record, claim: s.sql.plainClaim, final: s.sql.plainRecordUnit, recordFirst: s.sql.plainRecordFirst,
			req: req, lease: s.lockTimeoutArg}
	}
	return &Recording{sql: s.sql.record, claim: s.sql.claim, final: s.sql.recordUnit, recordFirst: s.sql.recordFirst,
		req: req, lease: s.lockTimeoutArg}
}

// Assume makes the recording assume the key is new, on one PostgreSQL:
// the request sends no read of its key before its first unit; the read
// goes ahead of the claim in the unit's first batch instead (Queue), and a
// key that exists fails the claim, which ends the batch's implicit
// transaction there, with the read's answer in Found. A batch that opens
// a transaction block reads the key on its own first (ReadAhead), so that
// a key that exists costs no ROLLBACK.
func (rec *Recording) Assume(s *Store) {
	rec.peek, rec.peekAlone = s.sql.peekAssumed, s.sql.peek
}

// Assumes reports whether the recording assumes its key is new (Assume).
func (rec *Recording) Assumes() bool { return rec.peek != "" }

// ReadAhead reads the key on its own, for a recording that assumes it is
// new and is about to be sent in a transaction block: ErrNotRecorded, with
// Found set, when the key exists.
func (rec *Recording) ReadAhead(ctx context.Context, db DB) error {
	r := rec.req
	scope, key := r.Args.scopeKey(r.Scope, r.Key)
	p, found, err := scanPeeked(db.QueryRow(ctx, rec.peekAlone, scope, key, rec.lease, r.Workflow, r.Args.fingerprint(r.Fingerprint)))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedTable || pgErr.Code == pgerrcode.UndefinedFunction) {
			rec.Sent = true
			return &StoreMissingError{Err: err}
		}
		return err
	}
	if found {
		rec.Found = &p
		rec.Sent = true
		return ErrNotRecorded
	}
	// Read: the claim need not read it again (a key recorded since
	// fails the final insert, as any recording's does).
	rec.peek = ""
	return nil
}

// Queue adds the recording's claim to b, at the head of the transaction:
// for a recording that assumes its key is new, after the key's read.
func (rec *Recording) Queue(b *pgx.Batch) {
	rec.first = false
	r := rec.req
	scope, key := r.Args.scopeKey(r.Scope, r.Key)
	if rec.peek != "" {
		b.Queue(rec.peek, scope, key, rec.lease, r.Workflow, r.Args.fingerprint(r.Fingerprint))
	}
	b.Queue(rec.claim, scope, key)
}

// QueueRecord adds to b, at the head of the transaction, the insert that
// records the key with cp and takes the claim's lock itself
// (atomicphase_record_first, migration 020: see Store.Features), in place
// of the claim and of the final insert: for a unit sent whole (in one
// implicit transaction, or inside BEGIN and COMMIT), whose checkpoint is
// known before anything is sent. The unit's own statements come after it, so they never run for a
// key that exists (it raises RecordedMeanwhileCode) or that another
// transaction is recording (RecordingInFlightCode, at once). Read reads
// its answer.
func (rec *Recording) QueueRecord(b *pgx.Batch, cp *Checkpoint) {
	r := rec.req
	if rec.peek != "" {
		scope, key := r.Args.scopeKey(r.Scope, r.Key)
		b.Queue(rec.peek, scope, key, rec.lease, r.Workflow, r.Args.fingerprint(r.Fingerprint))
	}
	b.Queue(rec.recordFirst, rec.insertArgs(cp)...)
	rec.first = true
}

// recordFirstMissing matches PostgreSQL's message for a call of
// atomicphase_record_first that finds no such function ("function
// [schema.]atomicphase_record_first(text, …) does not exist"), and not
// one for a function of the unit's own whose name merely contains it.
var recordFirstMissing = regexp.MustCompile(`^function (.+\.)?atomicphase_record_first\(`)

// BeforeRead returns err, a failure of the batch at or before the
// recording's own result, as Read would: for a recording at the head of
// its unit (QueueRecord) whose function this database lacks (a pool at an
// older schema than the one Store.Features asked), ErrRecordFirstMissing,
// the recording marked sent: nothing of the batch ran, and the key is
// taken on its own, as one that exists. Inside BEGIN the failure comes
// with BEGIN's result when pgx prepares or describes the batch's
// statements before it runs them. Any other err is returned as it is.
func (rec *Recording) BeforeRead(err error) error {
	var pgErr *pgconn.PgError
	if !rec.first || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UndefinedFunction ||
		!recordFirstMissing.MatchString(pgErr.Message) {
		return err
	}
	rec.Sent, rec.Recorded = true, false
	return fmt.Errorf("%w: %w", ErrRecordFirstMissing, err)
}

// Read reads the claim's answer from br (and, first, the key's read that
// went ahead of it): an error raising RecordingInFlightCode when another
// transaction is recording the key, or RecordedMeanwhileCode when it
// exists (with Found set when the read saw it).
func (rec *Recording) Read(br pgx.BatchResults) error {
	rec.Sent, rec.Recorded = false, false
	rec.Found = nil
	rec.aheadFailed = false
	if rec.peek != "" {
		rows, _ := br.Query() // its error, if any, is the rows'
		rec.ahead = aheadRow{rows: rows}
		p, found, err := scanPeeked(&rec.ahead)
		rec.ahead.rows = nil
		if err != nil {
			// The batch failed at its first statement: pgx could not
			// prepare one of them (the recording's function missing,
			// BeforeRead), or the claim refused the key before the row
			// was sent.
			if rec.first {
				err = rec.BeforeRead(err)
			}
			return rec.refusedAhead(err)
		}
		if found {
			rec.Found = &p
		}
		if rec.ahead.err != nil {
			return rec.refusedAhead(rec.ahead.err)
		}
	}
	if rec.first {
		// The final insert went in the claim's place (QueueRecord).
		if err := rec.ReadFinal(br); err != nil {
			if missing := rec.BeforeRead(err); missing != err {
				return missing
			}
			var pgErr *pgconn.PgError
			rec.Sent = errors.Is(err, ErrNotRecorded) || errors.As(err, &pgErr) && pgErr.Code == RecordingInFlightCode
			return err
		}
		rec.Sent, rec.Recorded = true, true
		rec.Found = nil
		return nil
	}
	if _, err := br.Exec(); err != nil {
		// The claim's own refusal: the key is another request's. Any other
		// error says nothing of the key: the connection broke (the claim's
		// fate is unknown), or the batch failed before the claim ran (a
		// queued statement pgx could not prepare, whose error the first
		// result carries when no BEGIN goes before the claim).
		var pgErr *pgconn.PgError
		rec.Sent = errors.As(err, &pgErr) &&
			(pgErr.Code == RecordingInFlightCode || pgErr.Code == RecordedMeanwhileCode)
		return err
	}
	rec.Sent, rec.Recorded = true, true // claimed: the commit records the key
	// A key the read found and that was deleted before the claim: the
	// read is out of date.
	rec.Found = nil
	return nil
}

// refusedAhead is Read's answer when the read ahead of the recording
// (peekAssumedSQL) failed: when the claim it ran refused the key (after
// the read's row, which Found holds), nothing after the read ran, and it
// answers as the recording's own refusal would have: the key is another
// request's. Any other error is returned as it is.
func (rec *Recording) refusedAhead(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != RecordedMeanwhileCode && pgErr.Code != RecordingInFlightCode {
		// The server refused the batch before the read's row: pgx could
		// not prepare one of its statements (the key table's, or one of
		// the unit's). Resolve says which.
		rec.aheadFailed = errors.As(err, &pgErr)
		return err
	}
	rec.Sent = true
	if rec.first && pgErr.Code == RecordedMeanwhileCode {
		return ErrNotRecorded // as ReadFinal answers it
	}
	return err
}

// Resolve answers a batch that failed at the key's read ahead of the claim
// with err, an error of the server's that says nothing of the key (Read):
// the key is read on its own, on db, once the batch is closed. A key that
// exists is ErrNotRecorded, with Found set (a replay is answered, whatever
// the unit's statements are now); no key table, or no function of it, is
// a StoreMissingError; for a new key, err is the unit's own. Any other
// err is returned as it is.
func (rec *Recording) Resolve(ctx context.Context, db DB, err error) error {
	if !rec.aheadFailed {
		return err
	}
	rec.aheadFailed = false
	switch rerr := rec.ReadAhead(ctx, db); {
	case rerr == nil:
		rec.Sent, rec.Recorded = false, false
		return err
	default:
		return rerr
	}
}

// Final returns the statement that records the key with cp at the commit
// of its first unit, in place of cp's checkpoint, and its arguments.
func (rec *Recording) Final(cp *Checkpoint) (sql string, args []any) {
	return rec.final, rec.insertArgs(cp)
}

// insertArgs are the arguments of the insert that records the key with
// cp: atomicphase_record_unit's, and atomicphase_record_first's (the same).
func (rec *Recording) insertArgs(cp *Checkpoint) (args []any) {
	r := rec.req
	scope, key := r.Args.scopeKey(r.Scope, r.Key)
	args = []any{scope, key, r.Args.workflow(r.Workflow), r.Args.fingerprint(r.Fingerprint), r.Method, r.Path,
		r.Args.token(r.Token), rec.lease, r.Args.version(r.Version), cp.point(), cp.JumpTarget, cp.State, nil, nil, nil}
	if cp.Status != nil {
		body := cp.Body
		if body == nil {
			body = []byte{}
		}
		args[12], args[13], args[14] = *cp.Status, cp.Header, body
	}
	return args
}

// ReadFinal reads the final insert's answer from br: ErrNotRecorded when
// the key existed (the transaction then rolls back).
func (rec *Recording) ReadFinal(br pgx.BatchResults) error {
	err := br.QueryRow().Scan(&rec.Salt)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == RecordedMeanwhileCode {
		rec.Recorded = false
		return ErrNotRecorded
	}
	return err
}

// RecordAgain sends the recording on its own, outside any transaction:
// ErrNotRecorded when the key exists, whoever recorded it.
func (rec *Recording) RecordAgain(ctx context.Context, db DB) error {
	r := rec.req
	err := db.QueryRow(ctx, rec.sql, r.Scope, r.Key, r.Workflow, r.Fingerprint, r.Method, r.Path, r.State, r.Token, rec.lease, r.Version).
		Scan(&rec.Salt)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotRecorded
	}
	return err
}

// ownedBySQL reports whether a key holds the lock token $3.
const ownedBySQL = `SELECT lock_token = $3 FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1 AND idempotency_key = $2`

// OwnedBy reports whether the key holds token; found is false when the key
// does not exist.
func (s *Store) OwnedBy(ctx context.Context, db DB, scope, key string, token int64) (owned, found bool, err error) {
	err = db.QueryRow(ctx, s.sql.ownedBy, scope, key, token).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	return owned, err == nil, err
}

// takeSQL takes an unfinished key that is unlocked or stale, without a
// request at hand, under the caller's lock token. For the sweep ($5) it
// also re-checks what made the key due when the sweep picked it: not parked,
// past its backoff. See atomicphase_take in schema.sql.
const takeSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_take($1::text, $2::text, $3::bigint, $4::bigint, $5::boolean)`

// Take takes an unfinished key that nobody holds, under token. It returns
// nil when the key is finished, held by a live attempt, or absent (or, for
// the sweep, no longer due).
func (s *Store) Take(ctx context.Context, db DB, scope, key string, token int64, sweep bool) (*Row, error) {
	row := Row{Acquired: true}
	err := db.QueryRow(ctx, s.sql.take, scope, key, s.lockTimeoutUS, token, sweep).
		Scan(&row.Workflow, &row.RecoveryPoint, &row.JumpTarget, &row.State, &row.LockToken, &row.DownstreamSalt, &row.Attempts,
			&row.TookOver)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// The version the key started under: never changed once recorded, so
	// a read after the take sees the taken key's.
	if err := db.QueryRow(ctx, s.sql.versionOf, scope, key).Scan(&row.WorkflowVersion); err != nil {
		return nil, err
	}
	return &row, nil
}

// versionOfSQL reads the workflow version a key started under.
const versionOfSQL = `SELECT workflow_version FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1::text AND idempotency_key = $2::text`

// releaseSQL releases a lock, leaving the recovery point where the last
// committed phase put it. See atomicphase_release in schema.sql: it returns
// a row, and the statement's tag counts one, when it released the lock.
const releaseSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_release(
	$1::text, $2::text, $3::bigint, $4::text, $5::bigint, $6::boolean, $7::boolean, $8::boolean, $9::boolean)`

// Release describes a release: the key, the token it is fenced by, and
// what the failed attempt leaves on the row.
type Release struct {
	Scope, Key string
	Token      int64
	// Error is why the attempt failed (nil for a plain unlock), at most
	// MaxLastError bytes of valid UTF-8 without NUL.
	Error *string
	// RetryInUS is when the sweep may try the key again, in microseconds
	// from now; nil for at once (or when parking).
	RetryInUS *int64
	// Park parks the key for an operator; Final marks the park for good (a
	// permanent failure: a client's retry is refused until an operator
	// acts); Unknown marks the outcome of its foreign call unknown; Called
	// records that a foreign call of the key may have gone out.
	Park, Final, Unknown, Called bool
}

// MaxLastError bounds the error text stored on a key.
const MaxLastError = 2000

// Release releases a lock held with rel.Token. It reports whether it
// released anything: false when the token had moved on (another attempt
// took the key) or the key finished meanwhile.
func (s *Store) Release(ctx context.Context, db DB, rel *Release) (bool, error) {
	tag, err := db.Exec(ctx, s.sql.release, rel.Scope, rel.Key, rel.Token, rel.Error, rel.RetryInUS, rel.Park, rel.Unknown, rel.Final, rel.Called)
	return tag.RowsAffected() == 1, err
}

// renewSQL renews a lease; see atomicphase_renew in schema.sql.
const renewSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_renew($1::text, $2::text, $3::bigint, $4::bigint, $5::bigint)`

// Renew renews the lease of the key held with token for the Store's lock
// timeout from now. With callFor set it also marks a foreign call that may
// be in flight until callFor from now (nil leaves the mark as it is). It
// reports whether it renewed: false when the token moved on, or the key
// was released or finished.
func (s *Store) Renew(ctx context.Context, db DB, scope, key string, token int64, callFor *time.Duration) (bool, error) {
	var callUS *int64
	if callFor != nil {
		us := callFor.Microseconds()
		callUS = &us
	}
	sql := s.sql.renew
	if s.plain.Load() {
		sql = s.sql.plainRenew
	}
	tag, err := db.Exec(ctx, sql, scope, key, token, s.lockTimeoutArg, callUS)
	return tag.RowsAffected() == 1, err
}

// RecordingInFlightCode is the SQLSTATE atomicphase_record raises when
// another transaction is recording the same key at this moment.
const RecordingInFlightCode = "AP002"

// IsRecordingInFlight reports the error a recording raises when another
// transaction is recording the same key.
func IsRecordingInFlight(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == RecordingInFlightCode
}

// LockLostCode is the SQLSTATE atomicphase_checkpoint raises when the lock
// token moved on: the fencing check failed.
const LockLostCode = "AP001"

// IsLockLost reports the fencing failure a checkpoint raises.
func IsLockLost(err error) bool {
	if err == nil {
		return false // before pgErr, which escapes: no allocation on success
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == LockLostCode
}
