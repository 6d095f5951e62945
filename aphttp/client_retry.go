package aphttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxKeptBody bounds the bytes of an answer Do reads into memory: a
// problem's details, or the last retryable answer it may return.
const maxKeptBody = 64 << 10

// StatusError is an answer Do retried, or gave up on: the OnRetry hook's
// cause, and what ErrGaveUp's error wraps when the last attempt answered.
type StatusError struct {
	Status     int
	Problem    *Problem // nil when the answer was no problem details
	RetryAfter time.Duration
}

// Error says what the server answered.
func (e *StatusError) Error() string {
	if e.Problem != nil && e.Problem.Type != "" {
		return fmt.Sprintf("the server answered %d %s", e.Status, strings.TrimPrefix(e.Problem.Type, ProblemTypeBase))
	}
	return fmt.Sprintf("the server answered %d", e.Status)
}

// retryAnswer decides whether an answer is retried, and how long its
// Retry-After asks to wait.
func retryAnswer(r *Response) (time.Duration, bool) {
	typ := ""
	if r.Problem != nil {
		typ = r.Problem.Type
	}
	switch r.StatusCode {
	case http.StatusConflict:
		// docs/http.md: 409 means "retry me"; the draft's 409 for a key in
		// use has no problem type of ours.
		if typ != "" && typ != ProblemInProgress && typ != ProblemOutcomeUnknown {
			return 0, false
		}
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return 0, false
	}
	return retryAfter(r.Header), true
}

// retryAfter reads a Retry-After header: whole seconds, or an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(min(s, 1<<31)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// retryError decides whether an attempt that got no answer is retried: a
// connection refused, reset or broken before the answer came, or an
// attempt's own timeout. Not retried: the caller's context ending, a
// certificate the client does not trust, a redirect policy's refusal,
// a request that cannot be sent at all.
func retryError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verify) {
		return false
	}
	if strings.Contains(err.Error(), "stopped after") || strings.Contains(err.Error(), "unsupported protocol scheme") {
		return false // net/http's redirect limit; a URL no transport sends
	}
	return true
}

// backoff is the wait before the attempt after attempt n: MinBackoff
// doubled each time, at most MaxBackoff, less a random quarter, so that
// clients failed by one outage do not all come back at once.
func (c *Client) backoff(n int) time.Duration {
	d := c.maxWt
	if n < 30 {
		d = min(c.maxWt, c.minWait<<(n-1))
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// readProblem reads an application/problem+json answer's details into
// r.Problem, and gives the body back to be read again.
func readProblem(r *Response) error {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/problem+json" {
		return nil
	}
	if err := keepBody(r); err != nil {
		return err
	}
	data, _ := io.ReadAll(r.Body) // from memory
	r.Body = io.NopCloser(bytes.NewReader(data))
	var p Problem
	if json.Unmarshal(data, &p) == nil {
		r.Problem = &p
	}
	return nil
}

// keepBody reads r's body (up to maxKeptBody bytes) into memory and closes
// the connection's: the answer stays readable, and the connection is free
// for the next attempt.
func keepBody(r *Response) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxKeptBody))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("aphttp: reading the answer: %w", err)
	}
	return nil
}

func closeBody(r *Response) {
	if r != nil {
		_ = r.Body.Close()
	}
}
