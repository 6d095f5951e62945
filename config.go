package atomicphase

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	DefaultLockTimeout = 90 * time.Second
	DefaultCallGrace   = 10 * time.Second
	// DefaultVersionHorizon is Config.VersionHorizon's default.
	DefaultVersionHorizon = 24 * time.Hour
	DefaultMaxKeyLength   = 255
	DefaultPhaseRetries   = 5
	DefaultRetryBackoff   = 10 * time.Millisecond

	DefaultMaxAttempts       = 25
	DefaultAttemptBackoff    = time.Second
	DefaultMaxAttemptBackoff = time.Hour

	DefaultMaxPathLength          = 2048
	DefaultMaxResponseBytes       = 1 << 20
	DefaultMaxResponseHeaderBytes = 8 << 10
)

// Config configures a Runner. A nil *Config means all defaults.
type Config struct {
	// LockTimeout is the length of a key's lease: how long a locked,
	// unfinished key may go without its holder renewing the lock (every
	// phase commit does, and the holder renews it while a foreign call or a
	// long unit of phases runs) before the next retry may take it over and
	// resume it. It is stored on the key row with every renewal, so every
	// reader knows it. A holder that cannot renew in time cancels its work
	// and commits nothing more. Defaults to 90s.
	LockTimeout time.Duration

	// CallGrace is how long after a foreign call's lease ended a downstream
	// may still act on a request it had received: no other attempt takes
	// the key (and so none reconciles or calls again) until the lease of a
	// holder that was inside a foreign call has ended plus CallGrace. Set it
	// above the downstream's own server-side timeout. Defaults to 10s.
	CallGrace time.Duration

	// MaxKeyLength is the longest idempotency key accepted, in bytes (keys
	// are printable ASCII). Defaults to 255.
	MaxKeyLength int

	// MaxPathLength is the longest Request.Path (path and query) accepted,
	// in bytes: the path is stored with the key for its retention, so a
	// longer one is refused with ErrTooLong (414 over HTTP) before anything
	// is stored. Defaults to 2048.
	MaxPathLength int

	// MaxResponseBytes is the largest response body a phase may store with
	// the key; a larger one fails the phase permanently (a bug to fix, not a
	// request to retry). Defaults to 1 MiB.
	MaxResponseBytes int

	// MaxResponseHeaderBytes bounds the stored response headers, names and
	// values together, as MaxResponseBytes bounds the body. Defaults to
	// 8 KiB.
	MaxResponseHeaderBytes int

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

	// MaxAttempts is how many attempts (client retries and the sweep's
	// resumes together) an unfinished key gets before a failing one is
	// parked for an operator: the sweep stops trying it, while a client
	// retry still resumes it. Defaults to 25.
	MaxAttempts int

	// AttemptBackoff is the base of the backoff between the sweep's tries of
	// a key whose attempt failed: after attempt n the key rests a random
	// duration in [½, 1] × AttemptBackoff·2^(n-1), at most MaxAttemptBackoff.
	// Client retries are not held back, but for a key whose foreign call's
	// outcome is unknown and whose reconciliation failed: until its
	// backoff ends a client's retry is answered as in progress
	// (InProgressError, its RetryAfter the backoff's end) and counts no
	// attempt. Defaults to 1s.
	AttemptBackoff time.Duration

	// MaxAttemptBackoff caps AttemptBackoff's growth. Defaults to 1h.
	MaxAttemptBackoff time.Duration

	// VersionHorizon is how recently a process must have recorded a
	// workflow version (as it registers it, and as its sweep runs) for the
	// version to count as deployed. A key whose version no deployed
	// process runs, or whose recovery point no deployed version has, is
	// parked with an error that names it, instead of being taken in a
	// loop; one another deployment runs is left to it. Defaults to 24h.
	VersionHorizon time.Duration

	// MaxUnfinishedPerScope, when positive, refuses a new key (ErrTooManyKeys,
	// 429 over HTTP) while its scope already has that many unfinished keys,
	// parked ones included: a defence against a caller spraying keys by the
	// thousand, or minting parked keys with requests that fail for good. It
	// costs a count on the scope's unfinished keys for each new key, so it
	// is checked only when set, and it counts with an index the default
	// schema leaves out (every finish would write an entry in it): build
	// it with MigrateOpts.ScopeCap (atomicphase migrate --scope-cap);
	// CheckSchema refuses a Runner with a cap until it exists. Defaults to
	// 0 (no limit).
	MaxUnfinishedPerScope int

	// Observer is told of every decision the Runner and its Sweeper make,
	// and opens a span around every request and phase; see Observer. A
	// panic in one of its methods, as in RedactKey and RedactError, is
	// recovered and logged with its stack (to Logger, else slog's default
	// logger), and the request goes on without it: a hook never fails a
	// request nor strands its key. Defaults to nil (nothing observed, at
	// the cost of a nil check).
	Observer Observer

	// RedactKey, if set, rewrites the scope and key before they reach a log
	// line or an Observer's span and event attributes (a hash of them, say):
	// both are the user's data. Defaults to nil (logged as they are).
	RedactKey func(scope, key string) (string, string)

	// RedactError, if set, rewrites the text of an error before it is
	// stored on a key (KeyInfo.LastError), logged, or handed to an
	// Observer (Event.Err and the error a span ends with, whose Error
	// returns the rewritten text while errors.Is and errors.As still see
	// the original): phase errors may quote what the client sent, a card
	// number say. A text whose redaction panics is withheld whole.
	// Defaults to nil (kept as it is).
	RedactError func(msg string) string

	// Schema is the PostgreSQL schema that holds the key table and the
	// functions, as given to Migrate (MigrateOpts.Schema). Defaults to ""
	// (unqualified names, found through the connection's search_path).
	Schema string

	// Router, when set, chooses the pool each key's statements go to, by
	// the key's scope: the request's acquisition, its phases (the
	// application's statements with them), its renewals and releases, a
	// sweep's take of the key and the operator actions on one key. On
	// Citus, apcitus.Router sends each scope to the worker that holds its
	// shard, so the coordinator leaves the request's path. Statements
	// that read many scopes (the sweep's reads, listings, the console)
	// stay on the Runner's own pool. A Router that returns nil for a
	// scope sends it to the Runner's pool. Defaults to nil: every
	// statement goes to the Runner's pool.
	Router Router

	// Logger receives takeovers, retries and lost locks. Defaults to no
	// logging.
	Logger *slog.Logger

	// FaultInjector is called at every fault point; see the faultinject
	// package. Leave it nil outside tests: then fault points cost one nil
	// check. Defaults to nil.
	FaultInjector FaultInjector
}

// withDefaults returns the configuration with every zero field set to its
// default, or an error naming every invalid field and how to fix it.
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
	case out.VersionHorizon == 0:
		out.VersionHorizon = DefaultVersionHorizon
	case out.VersionHorizon < 0:
		errs = append(errs, fmt.Errorf("Config.VersionHorizon is %s; use a positive duration, or 0 for the default %s", out.VersionHorizon, DefaultVersionHorizon))
	}
	switch {
	case out.CallGrace == 0:
		out.CallGrace = DefaultCallGrace
	case out.CallGrace < 0:
		errs = append(errs, fmt.Errorf("Config.CallGrace is %s; use a positive duration, or 0 for the default %s", out.CallGrace, DefaultCallGrace))
	}
	switch {
	case out.MaxKeyLength == 0:
		out.MaxKeyLength = DefaultMaxKeyLength
	case out.MaxKeyLength < 0:
		errs = append(errs, fmt.Errorf("Config.MaxKeyLength is %d; use a positive length, or 0 for the default %d", out.MaxKeyLength, DefaultMaxKeyLength))
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxPathLength", &out.MaxPathLength, DefaultMaxPathLength},
		{"MaxResponseBytes", &out.MaxResponseBytes, DefaultMaxResponseBytes},
		{"MaxResponseHeaderBytes", &out.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("Config.%s is %d; use a positive size, or 0 for the default %d", f.name, *f.v, f.def))
		}
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
	switch {
	case out.MaxAttempts == 0:
		out.MaxAttempts = DefaultMaxAttempts
	case out.MaxAttempts < 0:
		errs = append(errs, fmt.Errorf("Config.MaxAttempts is %d; use a positive count, or 0 for the default %d", out.MaxAttempts, DefaultMaxAttempts))
	}
	switch {
	case out.AttemptBackoff == 0:
		out.AttemptBackoff = DefaultAttemptBackoff
	case out.AttemptBackoff < 0:
		errs = append(errs, fmt.Errorf("Config.AttemptBackoff is %s; use a positive duration, or 0 for the default %s", out.AttemptBackoff, DefaultAttemptBackoff))
	}
	switch {
	case out.MaxAttemptBackoff == 0:
		out.MaxAttemptBackoff = max(DefaultMaxAttemptBackoff, out.AttemptBackoff)
	case out.MaxAttemptBackoff < out.AttemptBackoff:
		errs = append(errs, fmt.Errorf("Config.MaxAttemptBackoff is %s, below AttemptBackoff %s; raise it, or 0 for the default %s", out.MaxAttemptBackoff, out.AttemptBackoff, DefaultMaxAttemptBackoff))
	}
	if out.MaxUnfinishedPerScope < 0 {
		errs = append(errs, fmt.Errorf("Config.MaxUnfinishedPerScope is %d; use a positive count, or 0 for no limit", out.MaxUnfinishedPerScope))
	}
	if err := checkSchemaName("Config.Schema", out.Schema); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("atomicphase: invalid config: %w", errors.Join(errs...))
	}
	return out, nil
}

// retryBackoff is the ceiling of the jittered sleep before retry number try
// (counting from 0).
func (c *Config) retryBackoff(try int) time.Duration {
	if try >= 62 || c.RetryBackoff > math.MaxInt64>>try {
		return math.MaxInt64 // RetryBackoff·2^try would overflow
	}
	return c.RetryBackoff << try
}

// attemptBackoff is how long a key whose attempt number attempts failed
// rests before the sweep tries it again: AttemptBackoff doubled per earlier
// attempt, capped at MaxAttemptBackoff, jittered down by up to half so that
// keys that failed together do not return together.
func (c *Config) attemptBackoff(attempts int) time.Duration {
	d := c.MaxAttemptBackoff
	if n := max(attempts-1, 0); n < 62 && c.AttemptBackoff <= c.MaxAttemptBackoff>>n {
		d = c.AttemptBackoff << n
	}
	return d/2 + rand.N(d/2+1)
}

// checkSchemaName accepts "" (the search_path) or a PostgreSQL identifier
// PostgreSQL would not truncate.
func checkSchemaName(field, schema string) error {
	if strings.HasPrefix(schema, "pg_") {
		return fmt.Errorf("%s %q starts with pg_, which PostgreSQL reserves for system schemas", field, schema)
	}
	if len(schema) > maxNameLength {
		return fmt.Errorf("%s %q is longer than %d bytes, which PostgreSQL would truncate", field, schema, maxNameLength)
	}
	for i := 0; i < len(schema); i++ {
		if c := schema[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%s %q must be printable ASCII", field, schema)
		}
	}
	if strings.Contains(schema, "$") {
		// The migrations' function bodies are dollar-quoted.
		return fmt.Errorf("%s %q may not contain $", field, schema)
	}
	return nil
}

// A Router chooses the pool that serves a scope's keys (Config.Router).
// Any pool it returns must reach the same key table, migrated: on Citus,
// a worker with the cluster's metadata (every worker has it by default),
// where a statement about a shard that moved still reaches it, only later.
// Pool is called on every request; it must be fast and safe for
// concurrent use.
type Router interface {
	Pool(scope string) *pgxpool.Pool
}

// poolFor returns the pool for scope's keys: Config.Router's choice, else
// the Runner's pool.
func (r *Runner) poolFor(scope string) *pgxpool.Pool {
	if r.cfg.Router != nil {
		if p := r.cfg.Router.Pool(scope); p != nil {
			return p
		}
	}
	return r.pool
}
