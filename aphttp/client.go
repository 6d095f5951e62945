package aphttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// DefaultClientTimeout is ClientOptions.Timeout's default.
const DefaultClientTimeout = 2 * time.Minute

// ClientOptions configure a Client. A nil *ClientOptions means the
// defaults.
type ClientOptions struct {
	// HTTPClient sends each attempt. Its own retries, if it has any, must
	// be off: each would be an attempt this client does not pace. (net/http's
	// Transport has one that only DisableKeepAlives turns off: it resends a
	// request with an Idempotency-Key at once, on another connection, when
	// the server closed a kept-alive one before answering it. Do does not
	// see that resend, nor count it in Response.Attempts.) Defaults to
	// http.DefaultClient.
	HTTPClient *http.Client

	// Timeout bounds Do, every attempt and every wait together, and the
	// reading of the answer's body after it, when the request's context has
	// no earlier deadline. Defaults to
	// DefaultClientTimeout (two minutes): room for a key held by a call's
	// quiet period, whose 409 can ask for a minute and more.
	Timeout time.Duration

	// MinBackoff and MaxBackoff bound the wait before a retry: the n-th
	// retry waits MinBackoff·2ⁿ⁻¹, at most MaxBackoff, less a random
	// quarter of it, or the answer's Retry-After when that is longer.
	// Default to 250 milliseconds and 5 seconds.
	MinBackoff, MaxBackoff time.Duration

	// OnRetry, if set, is told of each retry before its wait: the attempt
	// that failed (1 for the first), how long Do waits, and why (a
	// *StatusError for an answer, else the error of the attempt). Defaults
	// to nothing.
	OnRetry func(attempt int, wait time.Duration, cause error)
}

// Client sends requests to a service behind Middleware (or any server
// that follows docs/http.md) and retries them as the server expects: with
// the same Idempotency-Key on every attempt, by problem type, with jittered
// exponential backoff, under the caller's deadline. See Do.
type Client struct {
	http           *http.Client
	timeout        time.Duration
	minWait, maxWt time.Duration
	onRetry        func(int, time.Duration, error)
}

// NewClient returns a Client configured by opts (nil for the defaults).
func NewClient(opts *ClientOptions) *Client {
	o := ClientOptions{}
	if opts != nil {
		o = *opts
	}
	c := &Client{http: o.HTTPClient, timeout: o.Timeout, minWait: o.MinBackoff, maxWt: o.MaxBackoff, onRetry: o.OnRetry}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	if c.timeout <= 0 {
		c.timeout = DefaultClientTimeout
	}
	if c.minWait <= 0 {
		c.minWait = 250 * time.Millisecond
	}
	if c.maxWt <= 0 {
		c.maxWt = 5 * time.Second
	}
	c.maxWt = max(c.maxWt, c.minWait)
	return c
}

// Response is the answer Do settled on.
type Response struct {
	*http.Response

	// Key is the Idempotency-Key every attempt carried: the caller's, or
	// the one Do generated. Empty for a method that carries none.
	Key string
	// Replayed is the server's Idempotent-Replayed: true: this answer was
	// read back from the key's store, and no phase ran for this attempt
	// (an earlier attempt, whose answer was lost, ran them).
	Replayed bool
	// Attempts is how many times Do sent the request, this answer's
	// attempt and the ones before it (and, when Do gave up, the ones after
	// it that got no answer).
	Attempts int
	// Problem is the answer's problem details when it is one
	// (application/problem+json) of at most 64 KiB, else nil. Its body can
	// still be read, whole: a longer problem is not read into memory, and
	// its body streams from the connection like any other answer's.
	Problem *Problem

	problemUnread bool // a problem over 64 KiB: Problem nil
}

// Do sends req and retries it until an answer no retry can change, as the
// server's contract says (docs/http.md):
//
//   - A POST or PATCH carries an Idempotency-Key: the caller's, when req has
//     one, else a new random one; the same key on every attempt. Every
//     attempt after the first is marked as a retry (RetryHeaderName), so
//     that the server reads its key first: a replay then costs it one
//     primary-key read.
//   - Retried: a connection that failed or broke before the answer came
//     (the request may have run: the key makes the retry safe); 409
//     in-progress and outcome-unknown (and a 409 with no problem type, the
//     draft's "in progress"); 429; 502, 503 and 504.
//   - Not retried: any other answer. 500 permanent-failure and parked say
//     that no retry changes anything until an operator acts; 422 key-reused
//     says the key was first sent with another request, so a retry can only
//     repeat that; another 4xx is the request's own fault. (A 409 whose
//     problem is over 64 KiB, whose type Do does not read, is none of the
//     retried ones either.)
//   - Not retried either, and returned as the error: a request that cannot
//     be sent whatever the connection, wrapping ErrUnsendable: a header or
//     trailer name that is no HTTP token or a value with a control
//     character, a method that is no token, a URL without a host, a body
//     that fails to read (or req.GetBody failing) or whose length is not
//     req.ContentLength (when positive). Do returns the error of the first
//     attempt, which found it. So too a server certificate the client does
//     not trust, a URL scheme the HTTPClient does not send, and a redirect
//     its CheckRedirect refused.
//
// Between attempts Do waits a jittered exponential backoff, or the
// answer's Retry-After when that is longer (a key held by a call's quiet
// period can ask for a minute and more). It never waits past the deadline:
// req's context's, or ClientOptions.Timeout from now when that comes
// first. When the next attempt cannot start before the deadline, Do stops
// and returns an error wrapping ErrGaveUp, context.DeadlineExceeded (or the
// context's own error) and the last attempt's cause, with the last answer,
// if there was one, as the Response (its body read back into memory, up to
// 64 KiB: a longer body reads as its first 64 KiB and then an error saying
// so, in place of io.EOF).
//
// An answer Do settles on is returned as it came: its body streams from
// the connection, whole. A problem's body (application/problem+json) is
// read into memory to fill Response.Problem, and given back to be read
// again, when it is at most 64 KiB; a longer one is handed over unread,
// streaming, with Problem nil.
//
// req's body is sent once per attempt: Do uses req.GetBody (which
// http.NewRequest sets for in-memory bodies), or reads the body into
// memory once when there is none. The caller closes the returned
// Response's Body.
func (c *Client) Do(req *http.Request) (*Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), c.timeout)
	resp, err := c.do(ctx, req)
	if err != nil || resp == nil {
		cancel()
		return resp, err
	}
	// The answer's body is read after Do returns, under the deadline:
	// closing it ends the deadline's context.
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose is a response body that cancels its request's context
// when closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// do is Do under the deadline's context.
func (c *Client) do(ctx context.Context, req *http.Request) (*Response, error) {
	key, err := c.key(req)
	if err != nil {
		return nil, err
	}
	body, err := rewindable(req)
	if err != nil {
		return nil, err
	}
	var last *Response // the last answer, kept to return when Do gives up
	for attempt := 1; ; attempt++ {
		var cause error
		var asked time.Duration // the answer's Retry-After
		resp, final, err := c.send(ctx, req, key, body, attempt > 1)
		switch {
		case err != nil && ctx.Err() != nil:
			return gaveUp(last, attempt), fmt.Errorf("%w after %d attempts: %w", ErrGaveUp, attempt, err)
		case err != nil && (final || !retryError(err)):
			closeBody(last)
			return nil, err
		case err != nil:
			cause = err
		default:
			resp.Attempts = attempt
			retry := false
			asked, retry = retryAnswer(resp)
			if !retry {
				closeBody(last)
				return resp, nil
			}
			closeBody(last)
			last, cause = resp, &StatusError{Status: resp.StatusCode, Problem: resp.Problem, RetryAfter: asked}
			if err := keepBody(resp); err != nil {
				cause = err
			}
		}
		wait := max(c.backoff(attempt), asked)
		if deadline, ok := ctx.Deadline(); (ok && time.Now().Add(wait).After(deadline)) || ctx.Err() != nil {
			why := ctx.Err()
			if why == nil {
				why = context.DeadlineExceeded
			}
			return gaveUp(last, attempt), fmt.Errorf("%w after %d attempts (the next could not start before the deadline: %w): %w", ErrGaveUp, attempt, why, cause)
		}
		if c.onRetry != nil {
			c.onRetry(attempt, wait, cause)
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return gaveUp(last, attempt), fmt.Errorf("%w after %d attempts: %w: %w", ErrGaveUp, attempt, ctx.Err(), cause)
		}
	}
}

// gaveUp returns the last answer, if any, as the one Do gives up with,
// counting every attempt made.
func gaveUp(last *Response, attempts int) *Response {
	if last != nil {
		last.Attempts = attempts
	}
	return last
}

// ErrGaveUp is wrapped by Do's error when it stopped retrying without an
// answer it could settle on: the deadline came first, or the request's
// context was canceled.
var ErrGaveUp = errors.New("aphttp: gave up retrying")

// ErrUnsendable is wrapped by Do's error when the request itself cannot be
// sent, whatever the connection: a header HTTP forbids, a body that fails
// to read or whose length is not its ContentLength (see Do). No retry
// could send it, so Do returns after the attempt that found it.
var ErrUnsendable = errors.New("aphttp: the request cannot be sent")

// key returns the Idempotency-Key the request's attempts carry: req's own
// header's value as written (after checking it), a new one for a POST or
// PATCH without one, or "" for another method without one.
func (c *Client) key(req *http.Request) (string, error) {
	if vs := req.Header.Values(HeaderName); len(vs) > 0 {
		if _, err := ParseKey(req.Header); err != nil {
			return "", err
		}
		return vs[0], nil
	}
	if req.Method != http.MethodPost && req.Method != http.MethodPatch {
		return "", nil
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return FormatKey(hex.EncodeToString(b[:])), nil
}

// rewindable returns a function giving req's body anew for each attempt.
func rewindable(req *http.Request) (func() (io.ReadCloser, error), error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return func() (io.ReadCloser, error) { return http.NoBody, nil }, nil
	case req.GetBody != nil:
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	data, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("aphttp: reading the request body to send it on every attempt: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, nil
}

// send makes one attempt. final says that its error is one no retry can
// change: the request cannot be sent (ErrUnsendable), or the HTTPClient's
// redirect policy refused where the answer led.
func (c *Client) send(ctx context.Context, req *http.Request, key string, body func() (io.ReadCloser, error), retry bool) (r *Response, final bool, err error) {
	out := req.Clone(ctx)
	bodies := &sentBodies{get: body, length: req.ContentLength}
	b, err := bodies.GetBody()
	if err != nil {
		return nil, true, fmt.Errorf("%w: %w", ErrUnsendable, err)
	}
	out.Body, out.GetBody = b, bodies.GetBody
	if key != "" {
		out.Header.Set(HeaderName, key)
		if retry {
			// The server reads the key first: its answer was likely
			// stored by an earlier attempt (RetryHeaderName).
			out.Header.Set(RetryHeaderName, RetryHeaderValue)
		}
	}
	resp, err := c.http.Do(out)
	if err != nil {
		if fault := bodies.faulted(); fault != nil {
			return nil, true, fmt.Errorf("%w: %w: %w", ErrUnsendable, fault, err)
		}
		if why := unsendable(out); why != "" {
			return nil, true, fmt.Errorf("%w (%s): %w", ErrUnsendable, why, err)
		}
		// http.Client.Do gives an answer with its error only when its
		// CheckRedirect refused to follow it (the answer's body closed).
		return nil, resp != nil, err
	}
	r = &Response{Response: resp, Key: key, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if err := readProblem(r); err != nil {
		_ = resp.Body.Close()
		return nil, false, err
	}
	return r, false, nil
}
