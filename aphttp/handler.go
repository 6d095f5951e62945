// Package aphttp puts an atomicphase workflow behind a net/http handler,
// with the status codes of the IETF Idempotency-Key draft: 400 for a
// missing or malformed key, 409 with Retry-After while another request holds
// the key, 422 for a key reused with another payload, a byte-identical
// replay marked Idempotent-Replayed: true, 5xx with nothing stored for a
// transient failure, and errors as application/problem+json (RFC 9457).
//
// It is standard net/http middleware, so it drops into chi, gorilla, echo's
// standard adapter and plain muxes alike:
//
//	mw := aphttp.Middleware(runner, createRide, &aphttp.Options{
//		Scope: func(r *http.Request) (string, error) { return userFrom(r) },
//	})
//	mux.Handle("/rides", mw(listRides)) // GET passes through to listRides
package aphttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// ErrUnauthorized is what an Options.Scope function wraps to answer 401.
var ErrUnauthorized = errors.New("unauthorized")

// DefaultMaxBodyBytes is Options.MaxBodyBytes's default: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// Options configure Middleware. A nil *Options is invalid: Scope is
// required.
type Options struct {
	// Scope returns who the request is from (the authenticated user or
	// tenant); keys are unique per scope. An error wrapping
	// ErrUnauthorized answers 401 with its message as the detail; any
	// other error (the user store is down, say) is transient and answers
	// 503, since a client must not take it as final. Nothing is stored
	// either way. Required.
	Scope func(r *http.Request) (string, error)

	// MaxBodyBytes is the largest request body accepted; a larger one gets
	// 413 before anything is stored. Defaults to 1 MiB.
	MaxBodyBytes int64

	// PassThroughWithoutKey sends POST and PATCH requests that carry no
	// Idempotency-Key to the next handler instead of answering 400.
	// Defaults to false: a key is required.
	PassThroughWithoutKey bool

	// ContentType is sent with a workflow's response when it stored no
	// Content-Type header of its own. Defaults to "application/json".
	ContentType string

	// OnError, if set, is told of every 5xx answer's cause, for logging.
	// Defaults to nothing.
	OnError func(r *http.Request, err error)
}

// Middleware returns middleware that runs wf for POST and PATCH requests
// and passes GET, HEAD, OPTIONS, PUT, DELETE (and every other method) to the
// next handler untouched, except POST and PATCH in another case ("post",
// "Patch"), which it refuses (400, ProblemMethodCase) rather than let a
// router that ignores case run the handler unguarded. It panics if opts has no Scope function, which is
// a programming error caught at start-up.
func Middleware(runner *atomicphase.Runner, wf atomicphase.AnyWorkflow, opts *Options) func(http.Handler) http.Handler {
	if runner == nil || wf == nil {
		panic("aphttp: Middleware needs a runner and a workflow")
	}
	if opts == nil || opts.Scope == nil {
		panic("aphttp: Options.Scope is required: keys must be scoped to who sent them")
	}
	o := *opts
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.ContentType == "" {
		o.ContentType = "application/json"
	}
	return func(next http.Handler) http.Handler {
		return &handler{runner: runner, wf: wf, opts: o, next: next}
	}
}

type handler struct {
	runner *atomicphase.Runner
	wf     atomicphase.AnyWorkflow
	opts   Options
	next   http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPatch {
		if strings.EqualFold(r.Method, http.MethodPost) || strings.EqualFold(r.Method, http.MethodPatch) {
			// Methods are case-sensitive, but routers that match them
			// without regard to case would run the handler unguarded.
			WriteProblem(w, Problem{Type: ProblemMethodCase, Title: "Method not in upper case", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("the method %q is not %q: HTTP methods are case-sensitive; send it in upper case", r.Method, strings.ToUpper(r.Method))}, 0)
			return
		}
		h.next.ServeHTTP(w, r)
		return
	}
	// The header's syntax is checked here, before anything else; the key's
	// length and characters are the Runner's to check (Config.MaxKeyLength),
	// and Run's ErrInvalidKey answers the same 400 below.
	key, err := ParseKey(r.Header)
	switch {
	case errors.Is(err, ErrMissingKey) && h.opts.PassThroughWithoutKey:
		h.next.ServeHTTP(w, r)
		return
	case errors.Is(err, ErrMissingKey):
		WriteProblem(w, Problem{Type: ProblemMissingKey, Title: "Idempotency-Key header required", Status: http.StatusBadRequest,
			Detail: "send an Idempotency-Key header with a unique key for this request, and the same key on every retry of it"}, 0)
		return
	case err != nil:
		WriteProblem(w, Problem{Type: ProblemInvalidKey, Title: "Malformed Idempotency-Key header", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		return
	}
	scope, err := h.opts.Scope(r)
	switch {
	case errors.Is(err, ErrUnauthorized):
		WriteProblem(w, Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: err.Error()}, 0)
		return
	case err != nil:
		h.report(r, err)
		WriteProblem(w, Problem{Type: ProblemTransientFailure, Title: "Temporary failure", Status: http.StatusServiceUnavailable,
			Detail: "could not authenticate the request now; nothing was done, retry with the same Idempotency-Key"}, 1)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		WriteProblem(w, Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body may be at most %d bytes", h.opts.MaxBodyBytes)}, 0)
		return
	case err != nil:
		// The client went away or sent a broken body: nothing to answer.
		w.WriteHeader(http.StatusBadRequest)
		return
	}

	resp, err := h.runner.Run(r.Context(), h.wf, atomicphase.Request{
		Scope: scope, Key: key, Method: r.Method, Path: r.URL.RequestURI(), Params: body, Retry: IsRetry(r.Header),
	})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeResponse(w, resp)
}

// writeResponse writes a workflow's response: its status, headers (the
// configured content type when it set none) and body.
func (h *handler) writeResponse(w http.ResponseWriter, resp *atomicphase.Response) {
	hdr := w.Header()
	for k, vs := range resp.Header {
		hdr[k] = append([]string(nil), vs...)
	}
	if hdr.Get("Content-Type") == "" {
		hdr.Set("Content-Type", h.opts.ContentType)
	}
	if resp.Replayed {
		hdr.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// writeError maps Run's errors onto the draft's status codes. Whether an
// answer is final (4xx, a retry can only repeat it) or transient (409 or
// 5xx, a retry with the same key may succeed) is atomicphase.Retryable's
// decision; this only picks the status and problem type within each side.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if !atomicphase.Retryable(err) {
		switch {
		case errors.Is(err, atomicphase.ErrFingerprintMismatch):
			WriteProblem(w, Problem{Type: ProblemKeyReused, Title: "Idempotency-Key reused with a different request", Status: http.StatusUnprocessableEntity,
				Detail: "this key was first used with another method, path or body; use a new key for a new request"}, 0)
		case errors.Is(err, atomicphase.ErrParked):
			WriteProblem(w, Problem{Type: ProblemParked, Title: "Request failed permanently", Status: http.StatusInternalServerError,
				Detail: "an earlier attempt of this request met an error that retrying cannot fix; it is parked for an operator, and retrying it changes nothing until the operator acts"}, 0)
		case errors.Is(err, atomicphase.ErrPermanent):
			h.report(r, err)
			WriteProblem(w, Problem{Type: ProblemPermanentFailure, Title: "Request failed permanently", Status: http.StatusInternalServerError,
				Detail: "this request met an error that retrying cannot fix; it is parked for an operator, and retrying it changes nothing until the operator acts"}, 0)
		case errors.Is(err, atomicphase.ErrInvalidScope):
			h.report(r, err)
			WriteProblem(w, Problem{Type: ProblemInvalidScope, Title: "Server error", Status: http.StatusInternalServerError,
				Detail: "the server could not tell who sent this request; nothing was done"}, 0)
		case errors.Is(err, atomicphase.ErrTooLong):
			WriteProblem(w, Problem{Type: ProblemURITooLong, Title: "Request URI too long", Status: http.StatusRequestURITooLong, Detail: err.Error()}, 0)
		case errors.Is(err, atomicphase.ErrInvalidKey):
			WriteProblem(w, Problem{Type: ProblemInvalidKey, Title: "Malformed Idempotency-Key header", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		default: // atomicphase.ErrInvalidRequest, and any final answer added later
			WriteProblem(w, Problem{Type: ProblemInvalidRequest, Title: "Invalid request body", Status: http.StatusUnprocessableEntity, Detail: err.Error()}, 0)
		}
		return
	}
	var inProgress *atomicphase.InProgressError
	var tooMany *atomicphase.TooManyKeysError
	var answer *atomicphase.AnswerError
	switch {
	case errors.As(err, &answer):
		// The workflow's own answer to a retryable failure (atomicphase.Answer).
		h.writeResponse(w, &answer.Response)
	case errors.As(err, &tooMany):
		WriteProblem(w, Problem{Type: ProblemTooManyKeys, Title: "Too many requests in progress", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("at most %d requests of yours may be unfinished at once; retry after the Retry-After delay", tooMany.Limit)},
			retryAfterSeconds(tooMany.RetryAfter.Seconds()))
	case errors.As(err, &inProgress):
		WriteProblem(w, Problem{Type: ProblemInProgress, Title: "A request with this Idempotency-Key is in progress", Status: http.StatusConflict,
			Detail: "retry after the Retry-After delay to get its result"}, retryAfterSeconds(inProgress.RetryAfter.Seconds()))
	case errors.Is(err, atomicphase.ErrOutcomeUnknown):
		h.report(r, err)
		WriteProblem(w, Problem{Type: ProblemOutcomeUnknown, Title: "The outcome of this request's call is not known yet", Status: http.StatusConflict,
			Detail: "a call this request made may or may not have taken effect, and is being reconciled; it will not be repeated. Retry after the Retry-After delay"}, 1)
	case errors.Is(err, atomicphase.ErrLockLost):
		// A newer attempt took the key over; it owns the answer now.
		WriteProblem(w, Problem{Type: ProblemInProgress, Title: "A request with this Idempotency-Key is in progress", Status: http.StatusConflict,
			Detail: "a newer attempt took this request over; retry to get its result"}, 1)
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client hung up; nobody reads this answer.
		w.WriteHeader(499)
	case errors.Is(err, atomicphase.ErrStoreUnavailable):
		h.report(r, err)
		WriteProblem(w, Problem{Type: ProblemStoreUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			Detail: "no step of the request ran; retry with the same Idempotency-Key"}, 1)
	default:
		h.report(r, err)
		WriteProblem(w, Problem{Type: ProblemTransientFailure, Title: "Temporary failure", Status: http.StatusServiceUnavailable,
			Detail: "nothing was stored; retry with the same Idempotency-Key to resume where this attempt stopped"}, 1)
	}
}

func (h *handler) report(r *http.Request, err error) {
	if h.opts.OnError != nil {
		h.opts.OnError(r, err)
	}
}

// retryAfterSeconds rounds a wait up to whole seconds, at least one.
func retryAfterSeconds(s float64) int {
	return max(1, int(math.Ceil(s)))
}
