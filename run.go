package atomicphase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Run's path, top to bottom. Run checks and fingerprints the request, then
// chooses, once, one of two ways in:
//
//   - runNew, for a key not yet recorded of a workflow whose first unit can
//     record it (see fusesRecording): the key's recording rides at the head
//     of the first unit's transaction, and commits with it;
//   - runExisting, for every other key: one statement (keystore.Acquire)
//     records or takes the key, or says why not.
//
// A request of such a workflow not marked as a retry (Request.Retry) goes
// to runNew at once: the key's read rides ahead of the recording in the
// first unit's batch, and a key it finds is answered from there (runFound).
// A marked request reads the key first (keystore.Peek: one primary-key
// read, which is all a replay then costs) to choose. Either way an attempt that holds the key then runs the workflow
// from its recovery point (attempt.go, fusion.go); a key that is not taken
// is explained (refusal.go). The files follow the request downward: see
// docs/concepts.md, "The code, file by file".

// Run runs req through wf, once per idempotency key: the first attempt
// records the key and runs the phases; an attempt finding the key finished
// replays its stored response (Response.Replayed) without running any
// phase; an attempt finding it unfinished and unlocked (or locked longer ago
// than Config.LockTimeout) resumes at the phase after its recovery point.
//
// The way through: validate the request, fingerprint it, build the
// initial state, then acquire the key in one statement. An acquisition that
// did not take the key is explained (a replay, a fingerprint mismatch, or a
// key in progress); one that did starts an attempt, which runs the workflow
// from the recovery point stored on the key.
//
// Errors callers branch on: ErrInvalidKey, ErrInvalidRequest (nothing
// stored), *InProgressError (another attempt holds the key), ErrFingerprintMismatch,
// ErrLockLost, ErrStoreUnavailable (before the key was acquired, nothing
// ran), ErrSchemaMissing, and *PhaseError wrapping a phase's own error
// (rolled back, key unlocked, a retry resumes there); Retryable tells final
// answers from the rest. ctx governs the whole run; if it ends mid-phase the
// phase rolls back and the key is unlocked.
func (r *Runner) Run(ctx context.Context, wf AnyWorkflow, req Request) (*Response, error) {
	if wf == nil || wf.isNil() {
		return nil, Permanent(errors.New("atomicphase: Run given a nil workflow"))
	}
	if err := req.validate(&r.cfg); err != nil {
		return nil, err
	}
	fp, err := FingerprintOf(req.Method, req.Path, req.Params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := r.register(wf); err != nil {
		return nil, err
	}
	r.recordIfNew(ctx)
	if err := r.conflict(wf); err != nil {
		return nil, err
	}
	ctx, end := r.span(ctx, Span{Kind: SpanRequest, Workflow: wf.Name(), Scope: req.Scope, Key: req.Key})
	defer endOnPanic(end)
	resp, err := r.run(ctx, wf, &req, fp)
	end(err)
	return resp, err
}

// endOnPanic ends a span with the panic going through, then lets it go on;
// deferred, it does nothing when the function returns normally.
func endOnPanic(end func(error)) {
	if p := recover(); p != nil {
		end(fmt.Errorf("panic: %v", p))
		panic(p)
	}
}

// run is the rest of Run, under the request's span: it chooses the way in.
// The initial state is built (the input decoded, the start function run)
// only on the way in, once the key is known to be new or unfinished: a
// replay needs none.
func (r *Runner) run(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint) (*Response, error) {
	if !r.fusesRecording(wf) {
		return r.runExisting(ctx, wf, req, fp)
	}
	pool := r.poolFor(req.Scope)
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	}
	key := keystore.NewKeyArgs(req.Scope, req.Key, fp[:])
	key.Workflow, key.Version = wf.boxedNames()
	if !req.Retry && r.implicitCommits.Load() {
		if way := r.assumeWayFor(pool); way.ok {
			// Not a retry, most likely a new key: the key is read in
			// the first unit's batch, ahead of its recording.
			if err := r.faultBeforeTake(ctx, wf.Name(), pc, false); err != nil {
				return nil, injected(err)
			}
			return r.runNew(ctx, wf, req, fp, key, pc, &way)
		}
	}
	p, found, err := r.store.Peek(ctx, pc.Conn(), key, wf.Name())
	switch {
	case err != nil:
		pc.Release()
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	case !found:
		// The key is recorded by the first unit's commit: no statement
		// takes it, and the point is passed without a connection.
		if err := r.faultBeforeTake(ctx, wf.Name(), pc, false); err != nil {
			return nil, injected(err)
		}
		return r.runNew(ctx, wf, req, fp, key, pc, nil)
	}
	pc.Release()
	return r.runFound(ctx, wf, req, fp, &p)
}

// runFound answers a request whose key its read found: a finished key
// replays, one held by a live attempt, recorded for another request or
// parked for good is refused, and the key of a failed or abandoned
// attempt is taken as any other's.
func (r *Runner) runFound(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint, p *keystore.Peeked) (*Response, error) {
	if refusedAsFound(p) {
		return r.refused(ctx, &p.Row, !p.Same, wf, req)
	}
	return r.runExisting(ctx, wf, req, fp)
}

// fusesRecording reports whether a new key of wf is recorded in its first
// phase's transaction: when the workflow begins with a local phase, at READ
// COMMITTED (a recording is never retried for a serialization failure), and
// without a cap on unfinished keys per scope (Config.MaxUnfinishedPerScope
// counts committed keys: a key still inside its first transaction would not
// count, and a caller could start any number of them at once).
func (r *Runner) fusesRecording(wf AnyWorkflow) bool {
	first := &wf.phaseSteps()[0]
	return first.call == nil && !first.alone && (first.isolation == "" || first.isolation == pgx.ReadCommitted) &&
		r.cfg.MaxUnfinishedPerScope <= 0
}

// runNew runs the workflow for a key Peek found absent, on pc (which it
// releases), with the key's recording in the first unit's transaction: the
// key and the first phases commit together. When another attempt recorded
// the key meanwhile (keystore.ErrNotRecorded), this one never held it: the
// request goes in as an existing key's, and acquisition explains the key as
// it then is.
//
// With assume (a request not marked as a retry), the key was not read: the
// recording reads it ahead of its claim, and a key it finds is answered as
// run answers one its read found. So is one whose request the start
// function refuses, read then: a request reusing another's key is told
// so, whatever its input.
func (r *Runner) runNew(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint, key keystore.KeyArgs, pc *pgxpool.Conn, assume *assumeWay) (resp *Response, err error) {
	state, err, p := r.initialStateOn(ctx, wf, req, pc)
	switch {
	case p != nil && assume != nil:
		// The key was not read: one that exists is answered as it is (a
		// finished key's answer is its stored one, whatever the code does
		// now), and only a new key's request meets the panic.
		return r.answerFoundOrPanic(ctx, wf, req, key, p)
	case p != nil:
		panic(p)
	case err != nil:
		if assume != nil {
			return r.runRefusedStart(ctx, wf, req, fp, key, pc, err)
		}
		pc.Release()
		return nil, err
	}
	token := newLockToken()
	key.Token = token
	kr := r.keyRequest(wf, req, fp, state, token)
	kr.Args = key
	rec := r.store.NewRecording(kr)
	a := &attempt{r: r, wf: wf, scope: req.Scope, key: req.Key, token: token, args: key, attempts: 1, fresh: true,
		resumedFrom: RecoveryPointStarted, conn: pc, rec: rec}
	if assume != nil {
		rec.Assume(r.store)
		a.assumed = assume.named
	}
	resp, err = a.loopNew(ctx, state, func(p any) (*Response, error) {
		return r.answerFound(ctx, wf, req, key, p, func() (*Response, error) {
			// The panicking code ran ahead of the key's read (or of a
			// recording another request's beat): the key, an earlier
			// attempt's, is taken as a request marked as a retry would
			// take it, and runs from where that attempt stopped; the
			// mark changes a request's cost, never its answer.
			return r.runExisting(ctx, wf, req, fp)
		})
	})
	var missing *keystore.StoreMissingError
	if errors.As(err, &missing) {
		// The key's read, at the head of the first unit, found no key
		// store: the request fails closed, as the read alone would.
		return nil, r.storeFailed(ctx, wf, req, "acquire key", missing.Err)
	}
	if errors.Is(err, keystore.ErrNotRecorded) {
		if rec.Found != nil {
			return r.runFound(ctx, wf, req, fp, rec.Found)
		}
		return r.runExisting(ctx, wf, req, fp)
	}
	return resp, err
}

// runRefusedStart answers a request whose start function refused it
// before its key was read (a request not marked as a retry): the key is read,
// on pc (released), and a key that exists is answered as run answers it;
// only a new key's request gets the start function's refusal, startErr.
func (r *Runner) runRefusedStart(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint, key keystore.KeyArgs, pc *pgxpool.Conn, startErr error) (*Response, error) {
	p, found, err := r.store.Peek(ctx, pc.Conn(), key, wf.Name())
	pc.Release()
	switch {
	case err != nil:
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	case !found:
		return nil, startErr
	}
	return r.runFound(ctx, wf, req, fp, &p)
}

// initialStateOn is initialState for a request that holds pc (or nil): a
// panic of the start function (or of the input's decoding) releases pc and
// is returned as p, for the caller to answer or let go on.
func (r *Runner) initialStateOn(ctx context.Context, wf AnyWorkflow, req *Request, pc *pgxpool.Conn) (state []byte, err error, p any) {
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic, or runtime.Goexit (whose recover is nil): the start
		// function did not return.
		p = recover()
		if pc != nil {
			pc.Release()
		}
	}()
	state, err = r.initialState(ctx, wf, req)
	returned = true
	return state, err, nil
}

// answerFoundOrPanic answers a request whose code panicked with p before
// the request knew its key: a start function run before the key was read
// (a request not marked as a retry, or a key acquired on its own), or a first
// unit whose key, riding in it unrecorded, another request recorded
// meanwhile. The key is read, and one that no attempt of this request
// would run is answered as run answers it (a finished key's answer is its
// stored one, whatever the code does now; a key in progress, recorded for
// another request or parked is refused); for any other key, or none, the
// panic goes on.
func (r *Runner) answerFoundOrPanic(ctx context.Context, wf AnyWorkflow, req *Request, key keystore.KeyArgs, p any) (*Response, error) {
	return r.answerFound(ctx, wf, req, key, p, nil)
}

// answerFound is answerFoundOrPanic, with takeable, when set, answering a
// key this request may take (an earlier attempt's) instead of the panic.
func (r *Runner) answerFound(ctx context.Context, wf AnyWorkflow, req *Request, key keystore.KeyArgs, p any, takeable func() (*Response, error)) (*Response, error) {
	pc, err := r.poolFor(req.Scope).Acquire(ctx)
	if err != nil {
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	}
	found, ok, err := r.store.Peek(ctx, pc.Conn(), key, wf.Name())
	pc.Release()
	switch {
	case err != nil:
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	case ok && refusedAsFound(&found):
		return r.refused(ctx, &found.Row, !found.Same, wf, req)
	case ok && takeable != nil:
		return takeable()
	}
	panic(p)
}

// refusedAsFound reports whether a key read as p is answered without an
// attempt: finished, held by a live attempt, recorded for another request,
// or parked for good.
func refusedAsFound(p *keystore.Peeked) bool {
	return p.ResponseStatus != nil || !p.Takeable || !p.Same || p.Parked
}

// runExisting acquires the key in one statement, which records it when it
// is new, then explains a refusal or runs an attempt from the key's
// recovery point.
func (r *Runner) runExisting(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint) (*Response, error) {
	state, err, p := r.initialStateOn(ctx, wf, req, nil)
	switch {
	case p != nil:
		key := keystore.NewKeyArgs(req.Scope, req.Key, fp[:])
		key.Workflow, key.Version = wf.boxedNames()
		return r.answerFoundOrPanic(ctx, wf, req, key, p)
	case err != nil:
		return nil, err
	}
	kr := r.keyRequest(wf, req, fp, state, newLockToken())
	kr.MaxUnfinished = r.maxUnfinished()
	sent := time.Now() // the lease starts no earlier
	row, err := r.acquire(ctx, kr)
	if inj := injected(err); inj != nil {
		return nil, inj
	}
	if err != nil {
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	}
	if !row.Acquired {
		mismatch := row.Workflow != wf.Name() || !bytes.Equal(row.Fingerprint, fp[:])
		return r.refused(ctx, row, mismatch, wf, req)
	}
	e := Event{Workflow: wf.Name(), Scope: req.Scope, Key: req.Key}
	switch {
	case row.Attempts <= 1:
		e.Kind = EventCreated
	case row.TookOver:
		e.Kind = EventTakeover
	default:
		e.Kind = EventFailedRetry
	}
	def, ok := r.definitionFor(row, wf)
	if !ok {
		return nil, r.notRunnableHere(ctx, row, req.Scope, req.Key)
	}
	r.observe(ctx, e)
	return newAttempt(r, def, req.Scope, req.Key, row, sent).run(ctx, row)
}

// keyRequest is what the key store records of req.
func (r *Runner) keyRequest(wf AnyWorkflow, req *Request, fp Fingerprint, state []byte, token int64) *keystore.Request {
	return &keystore.Request{Scope: req.Scope, Key: req.Key, Workflow: wf.Name(), Fingerprint: fp[:],
		Method: req.Method, Path: req.Path, State: state, Token: token, Version: wf.Version()}
}

// maxUnfinished is keystore.Request.MaxUnfinished: nil for no limit.
func (r *Runner) maxUnfinished() *int32 {
	if r.cfg.MaxUnfinishedPerScope <= 0 {
		return nil
	}
	n := int32(min(r.cfg.MaxUnfinishedPerScope, math.MaxInt32))
	return &n
}
