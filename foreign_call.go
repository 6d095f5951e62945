package atomicphase

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/atomicphase/atomicphase/internal/fingerprint"
)

// ForeignCall guards a foreign phase's single call outside the database and
// hands it the downstream idempotency key.
type ForeignCall struct {
	key  string
	mu   sync.Mutex
	used bool
	// sent are the requests Transport let through: the one call and the
	// redirects the client followed from it; followed are the redirect
	// answers already followed, each at most once.
	sent     []*http.Request
	followed map[*http.Response]bool
	// violated records a second call even if the phase swallowed the
	// error, so the Runner can fail the phase regardless.
	violated bool
	// operatorResult is the call's result an operator recorded with a
	// verdict of happened (Runner.RecordResolutionWithResult).
	operatorResult []byte
}

// newForeignCall returns the guard for one run of a foreign phase whose
// downstream key is key.
func newForeignCall(key string) *ForeignCall {
	return &ForeignCall{key: key}
}

// Key returns the downstream idempotency key: derived from the key row (its
// workflow, scope, client key and a salt drawn when the row was first
// recorded) and the phase. It is identical on every retry of the request,
// distinct across scopes and phases, and new for a new row under the same
// client key (after the old row was deleted), so an old downstream result
// is never re-linked to a new request. Send it to the downstream as its
// idempotency key.
func (c *ForeignCall) Key() string { return c.key }

// OperatorResult returns the call's result, as JSON, that an operator
// recorded with a verdict that the call happened
// (Runner.RecordResolutionWithResult), and true; nil and false when there
// is none. Only a reconcile function sees one: read it there and record it
// in the state as the call function would have, since the verdict then
// stands in for the call.
func (c *ForeignCall) OperatorResult() ([]byte, bool) {
	return c.operatorResult, c.operatorResult != nil
}

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

// claimed reports whether the call was made (or tried).
func (c *ForeignCall) claimed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

func (c *ForeignCall) wasViolated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violated
}

// Transport returns an http.RoundTripper around base (http.DefaultTransport
// when nil) that lets exactly one request through, with its Idempotency-Key
// header set to Key. A key the request already carries is replaced: SDKs
// such as stripe-go put a random key on every request unless told otherwise,
// and a random key on a retry is a second charge. Give it to an HTTP client,
// such as a payment SDK's, for the duration of the phase; client-side
// retries must be off, since each would count as another call.
//
// Redirects are part of the one call: when the client follows a redirect
// of the request that went through, the follow-up request passes too,
// carrying Key as well.
func (c *ForeignCall) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if !c.followsRedirect(req) {
			if err := c.claim(); err != nil {
				return nil, err
			}
		}
		out := req.Clone(req.Context())
		out.Header.Set("Idempotency-Key", c.key)
		// net/http re-sends a request whose connection broke after it was
		// written when it thinks the request replayable, and it takes an
		// Idempotency-Key header for a licence to replay: below this guard,
		// unseen, a second send. A body it cannot rewind (no GetBody, and
		// never nil or http.NoBody) makes a request not replayable, whatever
		// its method and headers (net/http and its HTTP/2 transport re-send
		// such a request only when nothing of it was written).
		out.Body, out.GetBody = &sendOnce{body: req.Body}, nil
		c.mu.Lock()
		c.sent = append(c.sent, req, out) // a redirect names either
		c.mu.Unlock()
		return base.RoundTrip(out)
	})
}

// sendOnce is a request body that net/http cannot rewind, around the
// request's own (nil for none: it reads as empty, and net/http then sends
// no body, as for a nil one).
type sendOnce struct{ body io.ReadCloser }

func (b *sendOnce) Read(p []byte) (int, error) {
	if b.body == nil {
		return 0, io.EOF
	}
	return b.body.Read(p)
}

func (b *sendOnce) Close() error {
	if b.body == nil {
		return nil
	}
	return b.body.Close()
}

// followsRedirect reports whether req is the client following a redirect
// answered to a request this call already sent: its Response is that
// redirect, whose Request is one of ours, and no request followed it yet (a
// copy of the follow-up, re-sent, is a second call).
func (c *ForeignCall) followsRedirect(req *http.Request) bool {
	if req.Response == nil || req.Response.Request == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.followed[req.Response] {
		return false
	}
	for _, s := range c.sent {
		if s == req.Response.Request {
			if c.followed == nil {
				c.followed = map[*http.Response]bool{}
			}
			c.followed[req.Response] = true
			return true
		}
	}
	return false
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// DownstreamKeyOf derives the downstream idempotency key (ForeignCall.Key)
// that the foreign phase named phase (its oldest name, WithFormerNames) of
// the key (scope, key) of workflow sends, from the key's downstream salt
// (KeyInfo.DownstreamSalt, kept in the audit trail of a forced forget):
// the reference to ask a downstream about once the key's row is gone.
func DownstreamKeyOf(salt, workflow, scope, key, phase string) string {
	return downstreamKey(salt, workflow, scope, key, phase)
}

// downstreamKey derives the idempotency key a foreign phase sends to the
// downstream for (salt, workflow, scope, key, phase). Each part is
// length-prefixed before hashing, so no two distinct tuples collide by
// concatenation. Rows recorded before the salt existed have none and keep
// the keys they were already sending.
func downstreamKey(salt, workflow, scope, key, phase string) string {
	var sum [32]byte
	if salt == "" {
		sum = fingerprint.HashParts("atomicphase-downstream-v1", workflow, scope, key, phase)
	} else {
		sum = fingerprint.HashParts("atomicphase-downstream-v2", salt, workflow, scope, key, phase)
	}
	var b [3 + 40]byte // one allocation: the string
	copy(b[:], "ap_")
	hex.Encode(b[3:], sum[:20])
	return string(b[:])
}

// callPhase makes a foreign phase's call (once), or learns by reconciling
// that an earlier attempt made it, and returns the state with its result.
// It holds no connection.
func (a *attempt) callPhase(ctx context.Context, st *step, state []byte) ([]byte, error) {
	if err := a.fault(ctx, st.name, BeforePhase, nil); err != nil {
		return nil, err
	}
	key := downstreamKey(a.salt, a.wf.Name(), a.scope, a.key, st.downstreamName)
	// The call runs under a lease renewed while it runs. A call to a
	// downstream without idempotency keys (a reconcile function) is also
	// marked on the key before anything goes out: from here on no other
	// attempt takes the key until the call cannot be in flight. (A
	// downstream with idempotency keys deduplicates a call repeated while
	// the first is in flight: it needs no mark, and costs no round trip.)
	l, lctx, err := a.hold(ctx, st.reconcile != nil)
	if err != nil {
		return nil, err
	}
	defer l.release()
	// From here a call may go out (or an earlier attempt's may be
	// reconciled): a failure now leaves a key that may have paid.
	a.paid = true
	lctx, cancel := a.bound(lctx)
	defer cancel()
	// The reconcile function gets a guard of its own, so that a lookup
	// made through it leaves the call's one claim unspent.
	out, happened, err := a.reconcile(lctx, st, newForeignCall(key), state)
	if err != nil || happened {
		if lerr := l.end(); lerr != nil && !ownLateLease(lerr, err) {
			return nil, lerr
		}
		if err != nil {
			a.callEnded(ctx, false) // nothing went out
		}
		return out, err
	}
	if lctx.Err() != nil {
		// The lease ended during the reconciliation: no call goes out
		// past it.
		_ = l.end()
		a.callEnded(ctx, false)
		return nil, leaseCause(l, context.Cause(lctx))
	}
	fc := newForeignCall(key)
	out, err = st.call(lctx, fc, state)
	// Passed while the call's lease still runs, under its context: the
	// answer may come late (faultinject.SlowCall), renewed meanwhile.
	ferr := a.fault(lctx, st.name, AfterForeign, nil)
	if errors.Is(ferr, ErrCrashed) {
		return nil, ferr // a dead process ends and marks nothing
	}
	if lerr := l.end(); lerr != nil && !ownLateLease(lerr, errors.Join(err, ferr)) {
		// Another attempt took the key, or the call's context ended with
		// the lease and the call failed: nothing of it may be committed
		// now.
		return nil, lerr
	}
	if err != nil && st.reconcile != nil {
		// The call is over: the key's quiet period shrinks to the grace
		// from now, so that a retry reconciles as soon as the downstream
		// can have acted, or ends now when nothing went out.
		a.callEnded(ctx, fc.claimed())
	}
	if ferr != nil {
		if st.reconcile != nil {
			// Whatever failed after the call, it may have gone out.
			ferr = outcomeUnknown(ferr)
			a.r.observe(ctx, Event{Kind: EventUnknown, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Err: ferr})
		}
		return nil, ferr
	}
	if fc.wasViolated() {
		err = Permanent(ErrSecondForeignCall) // even if the phase swallowed it
	}
	var answered *AnswerError
	if err != nil && st.reconcile != nil && !errors.Is(err, ErrPermanent) && !errors.As(err, &answered) {
		// The call may have gone out: nothing may repeat it now before
		// reconciliation tells. (An Answer says the downstream answered,
		// and created nothing.)
		err = outcomeUnknown(err)
		a.r.observe(ctx, Event{Kind: EventUnknown, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Err: err})
	}
	return out, err
}

// ownLateLease reports whether a lease's end error lerr was only its own
// renewals running late (no other attempt took the key) while the work it
// covered succeeded (err nil): the work's result is then kept, and its
// commit, fenced by the lock token, decides. A call's result is never
// dropped for a lease problem on this side.
func ownLateLease(lerr, err error) bool {
	return err == nil && errors.Is(lerr, errLeaseExpired)
}

// bound bounds ctx by the attempt's per-phase budget, when it has one.
func (a *attempt) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.budget <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, a.budget)
}
