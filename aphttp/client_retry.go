package aphttp

import (
	"bytes"
	"cmp"
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
	"sync"
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
		// use has no problem type of ours. A problem too long to read is
		// none of ours either.
		if r.problemUnread || typ != "" && typ != ProblemInProgress && typ != ProblemOutcomeUnknown {
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
// attempt's own timeout. Not retried (besides what send finds final: a
// request that cannot be sent, a redirect the HTTPClient refused): a
// certificate the client does not trust, a URL no transport sends.
func retryError(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verify) {
		return false
	}
	return !strings.Contains(err.Error(), "unsupported protocol scheme")
}

// unsendable says what in req net/http's client refuses to send, whatever
// the connection, or "" when it finds nothing: a field name that is no
// HTTP token, a field value with a control character, a method that is no
// token, a URL without a host. Only http and https URLs are checked, as
// net/http checks them: a transport of another scheme has its own rules.
func unsendable(req *http.Request) string {
	switch {
	case req.URL == nil:
		return "it has no URL"
	case req.RequestURI != "":
		return "its RequestURI is set, as only a server's requests have"
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return ""
	case req.URL.Host == "":
		return "its URL has no host"
	case !validPort(req.URL.Port()):
		return fmt.Sprintf("its URL's port %q is no port number", req.URL.Port())
	case req.Method != "" && !isToken(req.Method):
		return fmt.Sprintf("its method %q is no HTTP token", req.Method)
	}
	for what, h := range map[string]http.Header{"header": req.Header, "trailer": req.Trailer} {
		for name, values := range h {
			if !isToken(name) {
				return fmt.Sprintf("its %s name %q is no HTTP token", what, name)
			}
			for _, v := range values {
				// Like net/http's error, this names the field, not its
				// value: it may be a secret.
				if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
					return fmt.Sprintf("its %s %q has a control character in its value", what, name)
				}
			}
		}
	}
	return ""
}

// validPort reports whether p, a URL's port, is none ("") or a number a
// dial takes (1 to 65535).
func validPort(p string) bool {
	if p == "" {
		return true
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// isToken reports whether s is an HTTP token (RFC 9110, 5.6.2): the
// rule of field names and methods.
func isToken(s string) bool {
	for i := range len(s) {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// sentBodies gives an attempt's request bodies (its first, and any the
// HTTPClient asks for anew through GetBody, as net/http does to follow a
// redirect or resend on a new connection) and notes a fault of the body's
// own, which no retry can mend: GetBody failing, a read failing, or a
// length other than the request's ContentLength.
type sentBodies struct {
	get    func() (io.ReadCloser, error)
	length int64 // the request's ContentLength, checked when positive

	mu    sync.Mutex
	fault error // the first
}

// GetBody returns a body to send, watched.
func (s *sentBodies) GetBody() (io.ReadCloser, error) {
	b, err := s.get()
	if err != nil {
		err = fmt.Errorf("getting its body anew (GetBody): %w", err)
		s.mu.Lock()
		s.fault = cmp.Or(s.fault, err)
		s.mu.Unlock()
		return nil, err
	}
	if b == nil || b == http.NoBody {
		return b, nil // no body, no fault; and net/http knows NoBody
	}
	return &sentBody{ReadCloser: b, of: s}, nil
}

// faulted returns the fault noted, or nil.
func (s *sentBodies) faulted() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// sentBody is a request body that counts what the HTTPClient read of it.
type sentBody struct {
	io.ReadCloser
	of     *sentBodies
	n      int64 // under of.mu
	closed bool  // under of.mu: reads after Close are not the body's fault
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	s := b.of
	s.mu.Lock()
	defer s.mu.Unlock()
	b.n += int64(n)
	var fault error
	switch {
	case b.closed || s.fault != nil:
	case err != nil && err != io.EOF:
		fault = fmt.Errorf("reading the request body: %w", err)
	case s.length > 0 && b.n > s.length:
		fault = fmt.Errorf("its body is longer than its ContentLength, %d", s.length)
	case s.length > 0 && err == io.EOF && b.n < s.length:
		fault = fmt.Errorf("its body has %d bytes, its ContentLength says %d", b.n, s.length)
	}
	s.fault = cmp.Or(s.fault, fault)
	return n, err
}

func (b *sentBody) Close() error {
	b.of.mu.Lock()
	b.closed = true
	b.of.mu.Unlock()
	return b.ReadCloser.Close()
}

// backoff is the wait before the attempt after attempt n: MinBackoff
// doubled each time, at most MaxBackoff, less a random quarter, so that
// clients failed by one outage do not all come back at once.
func (c *Client) backoff(n int) time.Duration {
	d := c.minWait
	for i := 1; i < n && d < c.maxWt; i++ {
		if d > c.maxWt/2 {
			d = c.maxWt // doubling d could pass the largest Duration
		} else {
			d *= 2
		}
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// readProblem reads an application/problem+json answer's details into
// r.Problem and gives the body back whole, to be read again. A body over
// maxKeptBody bytes is not read into memory: r.Problem stays nil, and the
// body reads as the bytes read so far followed by the rest, from the
// connection.
func readProblem(r *Response) error {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/problem+json" {
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxKeptBody+1))
	if err != nil {
		_ = r.Body.Close()
		return fmt.Errorf("aphttp: reading the answer: %w", err)
	}
	if len(data) > maxKeptBody {
		r.problemUnread = true
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(data), r.Body), r.Body}
		return nil
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(data))
	var p Problem
	if json.Unmarshal(data, &p) == nil {
		r.Problem = &p
	}
	return nil
}

// keepBody reads r's body into memory, up to maxKeptBody bytes, and closes
// the connection's: the answer stays readable, and the connection is free
// for the next attempt. A body that was longer, or that failed to read,
// reads as what was kept and then an error saying so, never as a shorter
// body that ended well.
func keepBody(r *Response) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxKeptBody+1))
	_ = r.Body.Close()
	kept := &keptBody{Reader: bytes.NewReader(data)}
	switch {
	case err != nil:
		kept.end = fmt.Errorf("aphttp: reading the answer: %w", err)
	case len(data) > maxKeptBody:
		kept.Reader = bytes.NewReader(data[:maxKeptBody])
		kept.end = fmt.Errorf("aphttp: the answer's body is longer than the %d bytes (64 KiB) Do keeps of an answer it retried: the rest was not read", maxKeptBody)
	}
	r.Body = kept
	if err != nil {
		return kept.end
	}
	return nil
}

// keptBody is an answer's body as keepBody kept it in memory.
type keptBody struct {
	*bytes.Reader
	end error // instead of io.EOF: the body did not end there
}

func (b *keptBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF && b.end != nil {
		err = b.end
	}
	return n, err
}

func (b *keptBody) Close() error { return nil }

func closeBody(r *Response) {
	if r != nil {
		_ = r.Body.Close()
	}
}
