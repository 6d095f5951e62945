package atomicphase

import (
	"context"
	"encoding/hex"
	"net/http"
	"sync"
)

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

// newForeignCall returns the guard for one run of a foreign phase.
func newForeignCall(workflow, scope, key, phase string) *ForeignCall {
	return &ForeignCall{key: DownstreamKey(workflow, scope, key, phase)}
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
