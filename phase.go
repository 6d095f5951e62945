package atomicphase

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
)

// LocalFunc is the body of a phase that only touches the database. It runs
// inside the phase's transaction: everything it writes through tx commits
// together with the phase's recovery point and the updated state, or not at
// all. tx must not be committed or rolled back by the function (those calls
// return ErrPhaseTxControl). A returned error is transient: the transaction
// rolls back, the key is unlocked and a retry runs the phase again.
type LocalFunc[S any] func(ctx context.Context, tx pgx.Tx, state *S) (Outcome, error)

// CallFunc is the foreign half of a foreign phase. It runs with no
// transaction and no pooled connection held, and must make its one call
// through call (ForeignCall.Do or ForeignCall.Transport), which carries the
// downstream idempotency key. It records what the call returned in state; a
// returned error is transient (nothing stored, the retry repeats the call with
// the same downstream key).
type CallFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) error

// Phase is one step of a Workflow: one database transaction holding at most
// one foreign side effect. Build phases with Local and Foreign.
type Phase[S any] struct {
	name      string
	local     LocalFunc[S]
	call      CallFunc[S]
	isolation pgx.TxIsoLevel
	jumps     []string
}

// Local declares a phase that only touches the database.
func Local[S any](name string, fn LocalFunc[S]) Phase[S] {
	return Phase[S]{name: name, local: fn}
}

// Foreign declares a phase that makes one foreign call (call) and then
// records its result in a transaction (record, which may be nil when the
// state updated by call is all there is to record). The state and recovery
// point are committed with record's writes.
func Foreign[S any](name string, call CallFunc[S], record LocalFunc[S]) Phase[S] {
	return Phase[S]{name: name, call: call, local: record}
}

// WithIsolation returns a copy of p whose transaction runs at level instead
// of the workflow's isolation level (PostgreSQL's READ COMMITTED by default).
// Serialization failures and deadlocks are retried by the Runner.
func (p Phase[S]) WithIsolation(level pgx.TxIsoLevel) Phase[S] {
	p.isolation = level
	return p
}

// WithJumps returns a copy of p that may return JumpTo with any of the named
// phases. Declaring jumps lets NewWorkflow check every edge of the workflow:
// targets must exist and come later than p, so a workflow always ends.
func (p Phase[S]) WithJumps(targets ...string) Phase[S] {
	p.jumps = append(append([]string(nil), p.jumps...), targets...)
	return p
}

// Name returns the phase's name, which is also its recovery point.
func (p Phase[S]) Name() string { return p.name }

type outcomeKind uint8

const (
	outcomeContinue outcomeKind = iota
	outcomeJump
	outcomeRespond
)

// Outcome tells the Runner where a workflow goes after a phase commits. The
// zero value continues to the next phase.
type Outcome struct {
	kind   outcomeKind
	target string
	resp   Response
}

// Continue returns the outcome that runs the next phase in order.
func Continue() Outcome { return Outcome{} }

// JumpTo returns the outcome that runs the named phase next. The current
// phase must declare the target with WithJumps.
func JumpTo(phase string) Outcome { return Outcome{kind: outcomeJump, target: phase} }

// Respond returns the outcome that finishes the workflow: the response is
// stored in the phase's transaction and replayed, byte for byte, for every
// later request with the same key.
func Respond(status int, body []byte) Outcome {
	return Outcome{kind: outcomeRespond, resp: Response{Status: status, Body: body}}
}

// WithHeader returns a copy of a Respond outcome that also stores and
// replays the header key: value. It has no effect on other outcomes.
func (o Outcome) WithHeader(key, value string) Outcome {
	if o.kind != outcomeRespond {
		return o
	}
	h := o.resp.Header.Clone()
	if h == nil {
		h = make(http.Header)
	}
	h.Add(key, value)
	o.resp.Header = h
	return o
}

// Response is a workflow's final answer, stored with the key.
type Response struct {
	// Status is the HTTP-style status code the workflow responded with.
	Status int
	// Header holds the headers the workflow marked for replay.
	Header http.Header
	// Body is the response body, replayed byte for byte.
	Body []byte
	// Replayed is true when the response was read back from the store
	// rather than produced by this call.
	Replayed bool
}

// ForeignCall guards a foreign phase's single call outside the database and
// hands it the downstream idempotency key.
type ForeignCall struct {
	key  string
	mu   sync.Mutex
	used bool
	// violated records a second call even if the phase swallowed the
	// error, so the Runner can fail the phase regardless.
	violated bool
}

// Key returns the downstream idempotency key: derived from the workflow,
// scope, key and phase, identical on every retry of the request, distinct
// across scopes and phases. Send it to the downstream as its idempotency key.
func (c *ForeignCall) Key() string { return c.key }

// Do makes the phase's foreign call: it runs fn once with the downstream key.
// A second Do (or a second request through Transport) in the same phase
// returns ErrSecondForeignCall without running fn, and the phase fails.
func (c *ForeignCall) Do(ctx context.Context, fn func(ctx context.Context, key string) error) error {
	if err := c.claim(); err != nil {
		return err
	}
	return fn(ctx, c.key)
}

func (c *ForeignCall) claim() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used {
		c.violated = true
		return ErrSecondForeignCall
	}
	c.used = true
	return nil
}

func (c *ForeignCall) wasViolated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violated
}

// Transport returns an http.RoundTripper around base (http.DefaultTransport
// when nil) that lets exactly one request through, with an Idempotency-Key
// header set to Key unless the request already has one. Give it to an HTTP
// client, such as a payment SDK's, for the duration of the phase; client-side
// retries must be off, since each would count as another call.
func (c *ForeignCall) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if err := c.claim(); err != nil {
			return nil, err
		}
		if req.Header.Get("Idempotency-Key") == "" {
			req = req.Clone(req.Context())
			req.Header.Set("Idempotency-Key", c.key)
		}
		return base.RoundTrip(req)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// DownstreamKey derives the idempotency key a foreign phase sends to the
// downstream for (workflow, scope, key, phase). Each part is length-prefixed
// before hashing, so no two distinct tuples collide by concatenation.
func DownstreamKey(workflow, scope, key, phase string) string {
	sum := hashParts("atomicphase-downstream-v1", workflow, scope, key, phase)
	return "ap_" + hex.EncodeToString(sum[:20])
}

// String describes the phase as "local phase \"name\"" or "foreign phase \"name\"".
func (p Phase[S]) String() string {
	kind := "local"
	if p.call != nil {
		kind = "foreign"
	}
	return fmt.Sprintf("%s phase %q", kind, p.name)
}
