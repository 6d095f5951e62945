package atomicphase

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxScopeLength is the longest scope accepted, in bytes.
const maxScopeLength = 255

// Request is one attempt at an idempotent request.
type Request struct {
	// Scope is who the server authenticated (a user or tenant id): 1 to
	// 255 bytes of UTF-8 text. Keys are unique per scope: the same key under
	// two scopes is two requests. An empty scope is refused, since it would
	// let every caller without one replay every other's answers.
	Scope string
	// Key is the client's idempotency key: 1 to Config.MaxKeyLength
	// printable ASCII characters.
	Key string
	// Method and Path identify the operation; they are part of the
	// fingerprint.
	Method string
	Path   string
	// Params is the request's JSON body, fingerprinted in canonical form
	// (member order and whitespace do not matter) and decoded into the
	// workflow's input type (see NewWorkflow). It may be empty.
	Params []byte
	// Retry marks a request its client sent before (aphttp's Client marks
	// every retry, and aphttp's Handler reads the mark from the
	// Idempotency-Retry header: docs/http.md). A marked request reads its
	// key first, in a round trip of its own: a replay then costs a
	// primary-key read, and a new key one round trip more. An unmarked one
	// reads its key at the head of its first unit's batch, ahead of the
	// key's recording: a new key costs the two round trips hand-written
	// code does, and a replay one round trip, in which the first unit's
	// phases were built and then dropped unsent (its start function and
	// first phases run, their writes never reaching the database). The
	// mark changes what a request costs, never its answer. Defaults to
	// false.
	Retry bool
}

// maxMethodLength is the longest method accepted, in bytes: every method
// HTTP defines is far shorter.
const maxMethodLength = 32

// validate checks what Run needs of a request before it fingerprints it:
// what is stored with the key is bounded (cfg.MaxPathLength).
func (req *Request) validate(cfg *Config) error {
	if err := validateKey(req.Scope, req.Key, cfg.MaxKeyLength); err != nil {
		return err
	}
	switch {
	case len(req.Path) > cfg.MaxPathLength:
		return fmt.Errorf("%w: %w: the path is %d bytes; the limit is %d (Config.MaxPathLength)",
			ErrInvalidRequest, ErrTooLong, len(req.Path), cfg.MaxPathLength)
	case len(req.Method) > maxMethodLength:
		return fmt.Errorf("%w: the method is %d bytes; the limit is %d", ErrInvalidRequest, len(req.Method), maxMethodLength)
	}
	for _, f := range [...]struct{ name, v string }{{"method", req.Method}, {"path", req.Path}} {
		if !isText(f.v) {
			return fmt.Errorf("%w: %s is not valid UTF-8 text", ErrInvalidRequest, f.name)
		}
	}
	return nil
}

// validateKey is the one definition of a well-formed (scope, key): the key
// is 1 to maxKeyLength printable ASCII bytes (else ErrInvalidKey), the scope
// non-empty UTF-8 text of at most 255 bytes without NUL (else
// ErrInvalidScope). The HTTP adapter parses the header's syntax and leaves
// these rules to this function.
func validateKey(scope, key string, maxKeyLength int) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case len(key) > maxKeyLength:
		return fmt.Errorf("%w: the key is %d characters long; the limit is %d", ErrInvalidKey, len(key), maxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d of the key (0x%02x) is not printable ASCII", ErrInvalidKey, i, c)
		}
	}
	switch {
	case scope == "":
		return fmt.Errorf("%w: the scope is empty; give every caller a scope of its own (a user or tenant id), or one fixed name for a service with a single caller", ErrInvalidScope)
	case len(scope) > maxScopeLength:
		return fmt.Errorf("%w: the scope is %d bytes long; the limit is %d", ErrInvalidScope, len(scope), maxScopeLength)
	case !isText(scope):
		return fmt.Errorf("%w: the scope must be UTF-8 text without NUL", ErrInvalidScope)
	}
	return nil
}

// isText reports whether s is valid UTF-8 without NUL, which PostgreSQL's
// text type cannot hold.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
