package atomicphase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	DefaultLockTimeout  = 90 * time.Second
	DefaultMaxKeyLength = 255
	DefaultPhaseRetries = 5
	DefaultRetryBackoff = 10 * time.Millisecond
)

// Config configures a Runner. A nil *Config means all defaults.
type Config struct {
	// LockTimeout is how long a locked, unfinished key may go without a
	// phase commit before the next retry may take it over and resume it.
	// Set it above your slowest phase, foreign call included. Defaults to
	// 90s.
	LockTimeout time.Duration

	// MaxKeyLength is the longest idempotency key accepted, in bytes (keys
	// are printable ASCII). Defaults to 255.
	MaxKeyLength int

	// PhaseRetries is how many times a phase whose transaction met a
	// serialization failure or deadlock is retried, with jittered
	// exponential backoff, before the error reaches the caller. A foreign
	// phase's call is never repeated by these retries; only its recording
	// transaction is. Defaults to 5; a negative value disables retries.
	PhaseRetries int

	// RetryBackoff is the base of the jittered exponential backoff between
	// phase retries: the n-th retry sleeps a random duration in
	// [0, RetryBackoff·2^n). Defaults to 10ms.
	RetryBackoff time.Duration

	// Logger receives takeovers, retries and lost locks. Defaults to no
	// logging.
	Logger *slog.Logger

	// FaultInjector is called at every fault point; see the faultinject
	// package. Leave it nil outside tests: then fault points cost one nil
	// check. Defaults to nil.
	FaultInjector FaultInjector
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	var errs []error
	switch {
	case out.LockTimeout == 0:
		out.LockTimeout = DefaultLockTimeout
	case out.LockTimeout < time.Millisecond:
		errs = append(errs, fmt.Errorf("Config.LockTimeout is %s; use at least 1ms, or 0 for the default %s", out.LockTimeout, DefaultLockTimeout))
	}
	switch {
	case out.MaxKeyLength == 0:
		out.MaxKeyLength = DefaultMaxKeyLength
	case out.MaxKeyLength < 0:
		errs = append(errs, fmt.Errorf("Config.MaxKeyLength is %d; use a positive length, or 0 for the default %d", out.MaxKeyLength, DefaultMaxKeyLength))
	}
	switch {
	case out.PhaseRetries == 0:
		out.PhaseRetries = DefaultPhaseRetries
	case out.PhaseRetries < 0:
		out.PhaseRetries = 0
	}
	switch {
	case out.RetryBackoff == 0:
		out.RetryBackoff = DefaultRetryBackoff
	case out.RetryBackoff < 0:
		errs = append(errs, fmt.Errorf("Config.RetryBackoff is %s; use a positive duration, or 0 for the default %s", out.RetryBackoff, DefaultRetryBackoff))
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("atomicphase: invalid config: %w", errors.Join(errs...))
	}
	return out, nil
}

// Request is one attempt at an idempotent request.
type Request struct {
	// Scope is who the server authenticated (a user or tenant id). Keys
	// are unique per scope: the same key under two scopes is two requests.
	Scope string
	// Key is the client's idempotency key: 1 to Config.MaxKeyLength
	// printable ASCII characters.
	Key string
	// Method and Path identify the operation; they are part of the
	// fingerprint.
	Method string
	Path   string
	// Params is the request's JSON body, fingerprinted in canonical form
	// (member order and whitespace do not matter) and, by default, decoded
	// into the workflow's initial state. It may be empty.
	Params []byte
}

// Runner runs workflows against the key store. It is safe for concurrent use.
type Runner struct {
	pool *pgxpool.Pool
	cfg  Config

	mu        sync.RWMutex
	workflows map[string]AnyWorkflow
}

// NewRunner returns a Runner that stores keys through pool, which must reach
// a database migrated with Migrate (or schema.sql). It does not touch the
// database. config may be nil for the defaults.
func NewRunner(pool *pgxpool.Pool, config *Config) (*Runner, error) {
	if pool == nil {
		return nil, errors.New("atomicphase: NewRunner needs a pool")
	}
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Runner{pool: pool, cfg: cfg, workflows: map[string]AnyWorkflow{}}, nil
}

// Register makes workflows resumable by name with Resume. Run registers the
// workflow it runs, so Register is only needed in processes that resume keys
// they did not start (a background completer, say). Registering a different
// workflow under a name already taken is an error.
func (r *Runner) Register(workflows ...AnyWorkflow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, wf := range workflows {
		if wf == nil {
			return errors.New("atomicphase: Register given a nil workflow")
		}
		if have, ok := r.workflows[wf.Name()]; ok && have != wf {
			return fmt.Errorf("atomicphase: another workflow named %q is already registered", wf.Name())
		}
		r.workflows[wf.Name()] = wf
	}
	return nil
}

func (r *Runner) registered(wf AnyWorkflow) error {
	r.mu.RLock()
	have, ok := r.workflows[wf.Name()]
	r.mu.RUnlock()
	if ok && have == wf {
		return nil
	}
	return r.Register(wf)
}

// Run runs req through wf, once per idempotency key: the first attempt
// records the key and runs the phases; an attempt finding the key finished
// replays its stored response (Response.Replayed) without running any
// phase; an attempt finding it unfinished and unlocked (or locked longer ago
// than Config.LockTimeout) resumes at the phase after its recovery point.
//
// Errors callers branch on: ErrInvalidKey, ErrInvalidRequest (nothing
// stored), *InProgressError (another attempt holds the key), ErrFingerprintMismatch,
// ErrLockLost, ErrStoreUnavailable (before the key was acquired, nothing
// ran), and *PhaseError wrapping a phase's own error (rolled back, key
// unlocked, a retry resumes there). ctx governs the whole run; if it ends
// mid-phase the phase rolls back and the key is unlocked.
func (r *Runner) Run(ctx context.Context, wf AnyWorkflow, req Request) (*Response, error) {
	if wf == nil {
		return nil, errors.New("atomicphase: Run given a nil workflow")
	}
	if err := r.validate(&req); err != nil {
		return nil, err
	}
	fp, err := FingerprintOf(req.Method, req.Path, req.Params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	state, err := wf.initialState(&req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := r.registered(wf); err != nil {
		return nil, err
	}
	a := &attempt{r: r, wf: wf, scope: req.Scope, key: req.Key}
	if err := a.fault(ctx, "", BeforeAcquire, nil); err != nil {
		return nil, err
	}
	row, err := acquire(ctx, r.pool, &req, wf.Name(), fp, state, r.cfg.LockTimeout)
	if err != nil {
		return nil, storeError("acquire key", err)
	}
	if !row.Acquired {
		return r.refused(row, wf.Name(), fp)
	}
	return a.resume(ctx, row)
}

// Resume continues an unfinished key with no request at hand, from its
// recovery point, provided nobody holds it (or its lock is stale). Its
// workflow must be registered with this Runner. A finished key returns its
// stored response; a key never recorded returns ErrKeyNotFound.
func (r *Runner) Resume(ctx context.Context, scope, key string) (*Response, error) {
	if err := r.validateKey(scope, key); err != nil {
		return nil, err
	}
	row, err := resumeKey(ctx, r.pool, scope, key, r.cfg.LockTimeout)
	if err != nil {
		return nil, storeError("resume key", err)
	}
	if row == nil {
		info, err := r.Inspect(ctx, scope, key)
		if err != nil {
			return nil, err
		}
		if info.Response != nil {
			return info.Response, nil
		}
		return nil, inProgress(info.LockExpiresIn)
	}
	r.mu.RLock()
	wf, ok := r.workflows[row.Workflow]
	r.mu.RUnlock()
	if !ok {
		a := &attempt{r: r, scope: scope, key: key, token: row.LockToken}
		return nil, errors.Join(fmt.Errorf("%w: %q (key %q)", ErrUnknownWorkflow, row.Workflow, key), a.unlock(ctx))
	}
	a := &attempt{r: r, wf: wf, scope: scope, key: key}
	return a.resume(ctx, row)
}

// refused explains an acquisition that did not take the lock.
func (r *Runner) refused(row *keyRow, workflow string, fp Fingerprint) (*Response, error) {
	if row.Workflow != workflow || !bytes.Equal(row.Fingerprint, fp[:]) {
		return nil, ErrFingerprintMismatch
	}
	if row.ResponseStatus != nil {
		return &Response{Status: *row.ResponseStatus, Header: row.ResponseHeader, Body: row.ResponseBody, Replayed: true}, nil
	}
	return nil, inProgress(row.LockExpiresIn)
}

func inProgress(expiresInSeconds *float64) error {
	e := &InProgressError{RetryAfter: time.Second}
	if expiresInSeconds != nil {
		e.LockExpiresIn = max(0, time.Duration(*expiresInSeconds*float64(time.Second)))
		e.RetryAfter = min(e.RetryAfter, e.LockExpiresIn)
	}
	return e
}

// KeyInfo is what Inspect reports about a key.
type KeyInfo struct {
	Scope         string
	Key           string
	Workflow      string
	RecoveryPoint string
	// Locked is true while an attempt holds the key.
	Locked bool
	// LockExpiresIn is how long until a held lock goes stale.
	LockExpiresIn *float64
	// LockToken counts the acquisitions of the key.
	LockToken int64
	// State is the workflow state as of the last committed phase (JSON).
	State []byte
	// Response is the stored response once the key is finished.
	Response  *Response
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Inspect reads a key's stored row without locking or changing it, for
// operators and tests. A key never recorded returns ErrKeyNotFound.
func (r *Runner) Inspect(ctx context.Context, scope, key string) (*KeyInfo, error) {
	var row struct {
		KeyInfo
		Status *int
		Header http.Header
		Body   []byte
	}
	err := pgxscan.Get(ctx, r.pool, &row, `
		SELECT scope, idempotency_key AS key, workflow, recovery_point,
		       locked_at IS NOT NULL AS locked, lock_token, state,
		       extract(epoch FROM locked_at + $3 * interval '1 microsecond' - now())::float8 AS lock_expires_in,
		       response_status AS status, response_header AS header, response_body AS body,
		       created_at, updated_at
		FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2`,
		scope, key, r.cfg.LockTimeout.Microseconds())
	if pgxscan.NotFound(err) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, storeError("inspect key", err)
	}
	info := row.KeyInfo
	if row.Status != nil {
		info.Response = &Response{Status: *row.Status, Header: row.Header, Body: row.Body, Replayed: true}
	}
	return &info, nil
}

func (r *Runner) validate(req *Request) error {
	if err := r.validateKey(req.Scope, req.Key); err != nil {
		return err
	}
	for _, f := range [...]struct{ name, v string }{{"method", req.Method}, {"path", req.Path}} {
		if !utf8.ValidString(f.v) || bytes.IndexByte([]byte(f.v), 0) >= 0 {
			return fmt.Errorf("%w: %s is not valid UTF-8 text", ErrInvalidRequest, f.name)
		}
	}
	return nil
}

func (r *Runner) validateKey(scope, key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case len(key) > r.cfg.MaxKeyLength:
		return fmt.Errorf("%w: the key is %d characters long; the limit is %d", ErrInvalidKey, len(key), r.cfg.MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d of the key (0x%02x) is not printable ASCII", ErrInvalidKey, i, c)
		}
	}
	if len(scope) > 255 || !utf8.ValidString(scope) || bytes.IndexByte([]byte(scope), 0) >= 0 {
		return fmt.Errorf("%w: the scope must be UTF-8 text of at most 255 bytes without NUL", ErrInvalidKey)
	}
	return nil
}

// storeError classifies a failed key-store statement. The store counts as
// unavailable when the driver never got an answer (no server error at all),
// or when the server answered by dropping the connection: a FATAL or PANIC
// error, a connection exception (class 08) or an operator intervention
// (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now),
// as when the backend was terminated while the connection sat in the pool.
func storeError(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("atomicphase: %s: %w", what, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !connectionLost(pgErr) {
		return fmt.Errorf("atomicphase: %s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, what, err)
}

func connectionLost(e *pgconn.PgError) bool {
	return e.Severity == "FATAL" || e.Severity == "PANIC" ||
		strings.HasPrefix(e.Code, "08") || strings.HasPrefix(e.Code, "57P0")
}
