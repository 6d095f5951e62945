package aphttp

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypeBase prefixes every problem type URI this package writes; the
// fragment names a section of docs/http.md.
const ProblemTypeBase = "https://github.com/atomicphase/atomicphase/blob/main/docs/http.md#"

// The problem types (RFC 9457) this package answers with, documented in
// docs/http.md.
const (
	ProblemMissingKey       = ProblemTypeBase + "missing-key"       // 400
	ProblemInvalidKey       = ProblemTypeBase + "invalid-key"       // 400
	ProblemUnauthorized     = ProblemTypeBase + "unauthorized"      // 401
	ProblemInProgress       = ProblemTypeBase + "in-progress"       // 409
	ProblemBodyTooLarge     = ProblemTypeBase + "body-too-large"    // 413
	ProblemURITooLong       = ProblemTypeBase + "uri-too-long"      // 414
	ProblemOutcomeUnknown   = ProblemTypeBase + "outcome-unknown"   // 409
	ProblemKeyReused        = ProblemTypeBase + "key-reused"        // 422
	ProblemTooManyKeys      = ProblemTypeBase + "too-many-keys"     // 429
	ProblemInvalidRequest   = ProblemTypeBase + "invalid-request"   // 422
	ProblemPermanentFailure = ProblemTypeBase + "permanent-failure" // 500
	ProblemInvalidScope     = ProblemTypeBase + "invalid-scope"     // 500
	ProblemTransientFailure = ProblemTypeBase + "transient-failure" // 503
	ProblemStoreUnavailable = ProblemTypeBase + "store-unavailable" // 503
)

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WriteProblem writes p as application/problem+json. retryAfter, when
// positive, is sent as a Retry-After header in whole seconds.
func WriteProblem(w http.ResponseWriter, p Problem, retryAfterSeconds int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	body, _ := json.Marshal(p) // strings and an int: cannot fail
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
