package atomicphase

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Runner runs workflows against the key store. It is safe for concurrent use.
type Runner struct {
	pool *pgxpool.Pool
	cfg  Config
	sql  statements

	// lockTimeoutArg is the lock timeout in microseconds, boxed once for
	// the statements that take it.
	lockTimeoutArg any

	mu        sync.RWMutex
	workflows map[string]AnyWorkflow
}

// NewRunner returns a Runner that stores keys through pool, which must reach
// a database migrated with Migrate (or schema.sql). It does not touch the
// database; call CheckSchema to find out at start-up whether the schema is
// there. config may be nil for the defaults.
func NewRunner(pool *pgxpool.Pool, config *Config) (*Runner, error) {
	if pool == nil {
		return nil, errors.New("atomicphase: NewRunner needs a pool")
	}
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Runner{pool: pool, cfg: cfg, sql: newStatements(cfg.Schema), lockTimeoutArg: cfg.LockTimeout.Microseconds(),
		workflows: map[string]AnyWorkflow{}}, nil
}

// Register makes workflows resumable by name with Resume. Run registers the
// workflow it runs, so Register is only needed in processes that resume keys
// they did not start (a background completer, say). Registering a different
// workflow under a name already taken is an error.
func (r *Runner) Register(workflows ...AnyWorkflow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, wf := range workflows {
		if wf == nil || wf.isNil() {
			return errors.New("atomicphase: Register given a nil workflow")
		}
		if have, ok := r.workflows[wf.Name()]; ok && have != wf {
			return fmt.Errorf("atomicphase: another workflow named %q is already registered", wf.Name())
		}
		r.workflows[wf.Name()] = wf
	}
	return nil
}

// register registers wf unless it already is: one read lock on the hot path.
func (r *Runner) register(wf AnyWorkflow) error {
	if have, ok := r.workflow(wf.Name()); ok && have == wf {
		return nil
	}
	return r.Register(wf)
}

// workflow returns the workflow registered under name.
func (r *Runner) workflow(name string) (AnyWorkflow, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	wf, ok := r.workflows[name]
	return wf, ok
}

// workflowNames lists the registered workflows' names.
func (r *Runner) workflowNames() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.workflows))
	for name := range r.workflows {
		names = append(names, name)
	}
	return names
}

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
	if err := req.validate(r.cfg.MaxKeyLength); err != nil {
		return nil, err
	}
	fp, err := FingerprintOf(req.Method, req.Path, req.Params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := r.register(wf); err != nil {
		return nil, err
	}
	ctx, end := r.span(ctx, Span{Kind: SpanRequest, Workflow: wf.Name(), Scope: req.Scope, Key: req.Key})
	defer endOnPanic(end)
	resp, err := r.acquireAndRun(ctx, wf, &req, fp)
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

// acquireAndRun is the rest of Run, under the request's span: acquire the
// key, then explain a refusal or run an attempt. A workflow that begins
// with a local phase first reads the key (one primary-key read, which is
// all a replay costs); a new key is then recorded in its first phase's
// transaction (see recordAndRun). Any other key, and every key of a
// workflow that begins with a foreign phase, is acquired by one statement
// that decides every case.
//
// The initial state is built (the input decoded, the start function run)
// only once the key is known to be new or unfinished: a replay needs none.
func (r *Runner) acquireAndRun(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint) (*Response, error) {
	if err := r.fault(ctx, wf.Name(), "", BeforeAcquire, nil); err != nil {
		return nil, err
	}
	if r.fusesRecording(wf) {
		resp, err, done := r.recordAndRun(ctx, wf, req, fp)
		if done {
			return resp, err
		}
	}
	state, err := initialState(wf, req)
	if err != nil {
		return nil, err
	}
	row, err := r.acquire(ctx, req, wf.Name(), fp, state, newLockToken())
	if err != nil {
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err)
	}
	if !row.Acquired {
		mismatch := row.Workflow != wf.Name() || !bytes.Equal(row.Fingerprint, fp[:])
		return r.refused(ctx, row, mismatch, wf.Name(), req)
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
	r.observe(ctx, e)
	return newAttempt(r, wf, req.Scope, req.Key, row).run(ctx, row)
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

// recordAndRun reads the key and, when it is new, runs the workflow with
// the key's recording in the first phase's transaction: the key and the
// first phases commit together. done is false when the key exists and may
// be taken (a failed or abandoned attempt's), or was recorded meanwhile by
// another attempt: the caller then acquires it as any other.
func (r *Runner) recordAndRun(ctx context.Context, wf AnyWorkflow, req *Request, fp Fingerprint) (resp *Response, err error, done bool) {
	pc, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err), true
	}
	p, found, err := r.peek(ctx, pc.Conn(), req, wf.Name(), &fp)
	if err != nil {
		pc.Release()
		return nil, r.storeFailed(ctx, wf, req, "acquire key", err), true
	}
	if found {
		pc.Release()
		if p.ResponseStatus != nil || !p.takeable || !p.same {
			resp, err := r.refused(ctx, &p.keyRow, !p.same, wf.Name(), req)
			return resp, err, true
		}
		return nil, nil, false
	}
	state, err := initialState(wf, req)
	if err != nil {
		pc.Release()
		return nil, err, true
	}
	token := newLockToken()
	a := &attempt{r: r, wf: wf, scope: req.Scope, key: req.Key, token: token, attempts: 1, fresh: true,
		resumedFrom: RecoveryPointStarted, conn: pc, rec: r.newRecording(req, wf.Name(), fp, state, token)}
	defer a.parkOnPanic(ctx)
	resp, err = a.loop(ctx, 0, state)
	if errors.Is(err, errNotRecorded) {
		return nil, nil, false
	}
	return resp, err, true
}

// initialState builds a request's initial state: ErrInvalidRequest when
// the input does not decode or the start function refuses it.
func initialState(wf AnyWorkflow, req *Request) ([]byte, error) {
	state, err := wf.initialState(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return state, nil
}

// storeFailed reports a failed statement on the key store, before any
// phase ran.
func (r *Runner) storeFailed(ctx context.Context, wf AnyWorkflow, req *Request, what string, err error) error {
	err = storeError(what, err)
	r.observe(ctx, Event{Kind: EventStoreError, Workflow: wf.Name(), Scope: req.Scope, Key: req.Key, Err: err})
	return err
}

// refused explains, and reports, an acquisition that did not take the
// key: a key first used with another request, a finished key (replayed), a
// new key over its scope's limit, or a key another attempt holds.
func (r *Runner) refused(ctx context.Context, row *keyRow, mismatch bool, workflow string, req *Request) (*Response, error) {
	e := Event{Workflow: workflow, Scope: req.Scope, Key: req.Key}
	var resp *Response
	var err error
	switch {
	case mismatch:
		e.Kind, err = EventKeyMisuse, ErrFingerprintMismatch
	case row.ResponseStatus != nil:
		e.Kind = EventReplay
		resp = &Response{Status: *row.ResponseStatus, Body: row.ResponseBody, Replayed: true}
		if resp.Header, err = decodeHeader(row.ResponseHeader); err != nil {
			e.Kind, resp = EventStoreError, nil
			err = storeError("decode the stored response's header", err)
		}
	case row.OverLimit:
		e.Kind, err = EventOverLimit, &TooManyKeysError{Limit: r.cfg.MaxUnfinishedPerScope, RetryAfter: time.Second}
	default:
		e.Kind, err = EventInProgress, inProgress(row.LockExpiresIn)
	}
	r.observe(ctx, e)
	return resp, err
}

// maxUnfinished is atomicphase_acquire's p_max_unfinished: nil for no limit.
func (r *Runner) maxUnfinished() *int32 {
	if r.cfg.MaxUnfinishedPerScope <= 0 {
		return nil
	}
	n := int32(min(r.cfg.MaxUnfinishedPerScope, math.MaxInt32))
	return &n
}

// Resume continues an unfinished key with no request at hand, from its
// recovery point, provided nobody holds it (or its lock is stale). Its
// workflow must be registered with this Runner. A finished key returns its
// stored response; a key never recorded returns ErrKeyNotFound; a key whose
// workflow is not registered returns ErrUnknownWorkflow and is left unlocked.
func (r *Runner) Resume(ctx context.Context, scope, key string) (*Response, error) {
	return r.resume(ctx, scope, key, resumeOpts{})
}

// resumeOpts say who resumes a key, when it is not a caller of Resume.
type resumeOpts struct {
	// sweep: the Sweeper, which takes only keys still due, leaves alone
	// keys it cannot run (a recovery point its workflow lacks, in a
	// rolling deploy), and parks keys past Config.MaxAttempts.
	sweep bool
	// workflow and resolve: ResolveUnknown. The key's workflow must be
	// named workflow, and resolve stands in for the reconcile function of
	// the phase the attempt resumes into, which must have one.
	workflow string
	resolve  func([]byte) (bool, []byte, error)
}

// errNotRunnable is returned to the Sweeper for a key whose stored recovery
// point this process's workflow does not have: a newer deployment's key,
// left for the processes that run it.
var errNotRunnable = errors.New("atomicphase: recovery point unknown to this process's workflow")

func (r *Runner) resume(ctx context.Context, scope, key string, opts resumeOpts) (resp *Response, err error) {
	if !opts.sweep { // the sweep resumes keys another configuration recorded
		if err := validateKey(scope, key, r.cfg.MaxKeyLength); err != nil {
			return nil, err
		}
	}
	ctx, end := r.span(ctx, Span{Kind: SpanRequest, Scope: scope, Key: key})
	defer func() {
		if p := recover(); p != nil {
			end(fmt.Errorf("panic: %v", p))
			panic(p)
		}
		end(err)
	}()
	row, err := r.take(ctx, scope, key, newLockToken(), opts.sweep)
	if err != nil {
		err = storeError("resume key", err)
		r.observe(ctx, Event{Kind: EventStoreError, Scope: scope, Key: key, Err: err})
		return nil, err
	}
	if row == nil {
		info, err := r.Inspect(ctx, scope, key)
		if err != nil {
			return nil, err
		}
		if info.Response != nil {
			r.observe(ctx, Event{Kind: EventReplay, Workflow: info.Workflow, Scope: scope, Key: key})
			return info.Response, nil
		}
		r.observe(ctx, Event{Kind: EventInProgress, Workflow: info.Workflow, Scope: scope, Key: key})
		return nil, inProgress(info.LockExpiresIn)
	}
	wf, ok := r.workflow(row.Workflow)
	if !ok {
		return nil, errors.Join(fmt.Errorf("%w: %q", ErrUnknownWorkflow, row.Workflow),
			r.unlock(ctx, scope, key, row.LockToken))
	}
	kind := EventFailedRetry
	if row.TookOver {
		kind = EventTakeover
	}
	a := newAttempt(r, wf, scope, key, row)
	if opts.sweep {
		if !a.runnable(row) {
			return nil, errors.Join(errNotRunnable, r.unlock(ctx, scope, key, row.LockToken))
		}
		if row.Attempts > r.cfg.MaxAttempts {
			// Attempts that never finished (their processes died, or they
			// were taken over) count too: without this a key that kills
			// its process would be run forever.
			why := fmt.Errorf("%d attempts never finished; the limit is %d", row.Attempts-1, r.cfg.MaxAttempts)
			if _, err := r.release(ctx, scope, key, row.LockToken, why, 0, true, false); err != nil {
				return nil, err
			}
			r.observe(ctx, Event{Kind: EventParked, Workflow: row.Workflow, Scope: scope, Key: key, Err: why})
			return nil, &PhaseError{Workflow: row.Workflow, Err: why, Parked: true}
		}
	}
	if opts.resolve != nil {
		if err := a.acceptResolution(row, opts.workflow); err != nil {
			return nil, errors.Join(err, r.unlock(ctx, scope, key, row.LockToken))
		}
		a.resolve = opts.resolve
	}
	r.observe(ctx, Event{Kind: kind, Workflow: row.Workflow, Scope: scope, Key: key})
	return a.run(ctx, row)
}

// ErrNotUnknown is returned by ResolveUnknown for a key that is not waiting
// at a phase with a reconcile function: there is nothing to resolve.
var ErrNotUnknown = errors.New("atomicphase: key is not waiting to reconcile a call")

// ResolveUnknown settles, from outside, whether the foreign call of an
// unfinished key took effect — a downstream's webhook telling that a payout
// was made, say, or an operator who checked by hand — and carries the
// request on from there, as Resume does. resolve gets the key's state: it
// returns happened true after recording the call's result in the state (as
// the phase's call function would have), or false for a call that did not
// take effect, which is then made; an error leaves the outcome unknown.
//
// It takes the key through the normal acquisition path, fenced like any
// attempt: while a client retry or the sweep holds the key it returns
// ErrInProgress, and of a webhook and a sweep reconciling at once exactly
// one resolution is applied. It returns ErrNotUnknown, and changes nothing,
// when the key is not waiting at a phase of wf with a reconcile function;
// a finished key returns its stored response.
func ResolveUnknown[S any](ctx context.Context, r *Runner, wf *Workflow[S], scope, key string, resolve func(state *S) (happened bool, err error)) (*Response, error) {
	if wf == nil || resolve == nil {
		return nil, errors.New("atomicphase: ResolveUnknown needs a workflow and a resolve function")
	}
	if err := r.register(wf); err != nil {
		return nil, err
	}
	return r.resume(ctx, scope, key, resumeOpts{workflow: wf.Name(), resolve: func(raw []byte) (bool, []byte, error) {
		var s S
		if err := json.Unmarshal(raw, &s); err != nil {
			return false, nil, Permanent(fmt.Errorf("decode state: %w", err))
		}
		happened, err := resolve(&s)
		if err != nil || !happened {
			return false, nil, err
		}
		b, err := encodeState(&s)
		return true, b, err
	}})
}
