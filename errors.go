package atomicphase

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors returned by Run and Resume. Branch on them with errors.Is;
// the richer cases also have a typed error (InProgressError, PhaseError)
// reachable with errors.As.
var (
	// ErrInvalidKey means the idempotency key or scope is malformed: empty,
	// longer than Config.MaxKeyLength, or not printable ASCII. Nothing was
	// written.
	ErrInvalidKey = errors.New("atomicphase: invalid idempotency key")

	// ErrInvalidScope means the scope Run was given is not one the key
	// store can hold: empty (which would share keys among every such
	// caller), longer than 255 bytes, or not UTF-8 text without NUL. The
	// scope is the server's own value, so this is the server's bug, not the
	// client's. Nothing was written.
	ErrInvalidScope = errors.New("atomicphase: invalid scope")

	// ErrInvalidRequest means the request could not be fingerprinted or the
	// workflow's Start function rejected its parameters. Nothing was written,
	// so a corrected request may reuse the key.
	ErrInvalidRequest = errors.New("atomicphase: invalid request")

	// ErrTooLong wraps ErrInvalidRequest for a request whose path is longer
	// than Config.MaxPathLength: nothing was stored.
	ErrTooLong = errors.New("atomicphase: request path too long")

	// ErrInProgress means another attempt holds the key's lock. The error is
	// an *InProgressError carrying a retry-after hint.
	ErrInProgress = errors.New("atomicphase: request with this key is in progress")

	// ErrFingerprintMismatch means the key was first used with a different
	// request (method, path, parameters or workflow). Nothing changed.
	ErrFingerprintMismatch = errors.New("atomicphase: idempotency key reused with a different request")

	// ErrLockLost means this attempt was slower than the lock timeout and a
	// newer attempt took the key over. The phase that noticed rolled back;
	// the newer attempt owns the request now.
	ErrLockLost = errors.New("atomicphase: lock on idempotency key lost to a newer attempt")

	// ErrStoreUnavailable means PostgreSQL could not be reached, or the
	// connection broke before its answer arrived. When Run returns it from
	// the acquisition, no phase and no foreign call ran; the key may have
	// been recorded all the same (the statement committed, its answer was
	// lost), in which case Run unlocks it by its lock token, best effort, so
	// that a retry resumes at once rather than after the lock timeout.
	ErrStoreUnavailable = errors.New("atomicphase: key store unavailable")

	// ErrKeyNotFound is returned by Resume and Inspect for a key that was
	// never recorded.
	ErrKeyNotFound = errors.New("atomicphase: idempotency key not found")

	// ErrUnknownWorkflow is returned by Resume when the key's workflow was
	// not registered with the Runner.
	ErrUnknownWorkflow = errors.New("atomicphase: workflow not registered")

	// ErrSecondForeignCall fails a phase whose function asked ForeignCall.Do
	// (or the guarded HTTP transport) for a second foreign call.
	ErrSecondForeignCall = errors.New("atomicphase: a phase may make at most one foreign call")

	// ErrNoResponse fails a phase that continued past the workflow's last
	// phase without responding. Its transaction is rolled back.
	ErrNoResponse = errors.New("atomicphase: workflow ended without a response")

	// ErrCrashed is returned when a fault injector simulated a process
	// crash: the attempt stopped dead, its connection was closed without
	// commit, rollback or unlock, and the key stays locked until the lock
	// timeout. Only test code sees it.
	ErrCrashed = errors.New("atomicphase: attempt crashed (injected fault)")

	// ErrPermanent marks an error no retry of the same code can fix: a
	// phase that wraps its error with Permanent (a downstream's 400 for a
	// request it will never accept, say), and the framework's own
	// programming errors (ErrNoResponse, ErrSecondForeignCall, a jump or a
	// status the phase may not use, a stored recovery point the workflow no
	// longer has, a state that does not decode). The key is parked: unlocked
	// and marked, with the error, for an operator; Retryable reports false,
	// so clients stop instead of looping. A later retry (once the code is
	// fixed) resumes the key.
	ErrPermanent = errors.New("atomicphase: permanent failure")

	// ErrSchemaMissing means the database lacks the key table or a function
	// this version of the library needs: it was never migrated, was
	// migrated by an older version, or Config.Schema names another schema.
	// Run Migrate (or apply schema.sql). Runner.CheckSchema reports it at
	// start-up.
	ErrSchemaMissing = errors.New("atomicphase: key store schema missing or out of date")

	// ErrPhaseTxControl is returned by the phase transaction's Commit and
	// Rollback: the Runner commits a phase together with its recovery point,
	// so a phase must not end its transaction itself.
	ErrPhaseTxControl = errors.New("atomicphase: the runner commits and rolls back phase transactions")

	// ErrPhaseTxEscaped fails a phase, permanently, whose transaction was
	// ended through Tx.Conn: a COMMIT sent there (pgx.BeginFunc on it, say),
	// which fails and rolls the transaction back, or a ROLLBACK. The key is
	// parked, as for any programming error.
	ErrPhaseTxEscaped = errors.New("atomicphase: the phase's transaction was ended through Tx.Conn")

	// ErrDiscarded ends the span of a phase (Observer.StartSpan) whose code
	// ran before its key's read answered, on a request that did not say it
	// was a retry (Request.Retry), and whose key turned out to be another
	// request's (a finished key's replay, a key held or recorded
	// meanwhile) or not to be recordable (the key table missing). Nothing the phase queued ran and nothing it did was kept; the request
	// is answered as the key is found. It is no failure of the phase, and
	// Run never returns it.
	ErrDiscarded = errors.New("atomicphase: the phase ran before its key was read and its key was another request's; nothing of it was kept")
)

// ErrParked is Run's answer to a retry of a key parked by a permanent
// failure: an earlier attempt failed in a way no retry can fix, and the key
// waits for an operator (Unpark, Resume, RecordResolution, Forget). Nothing
// ran. (A key parked because it ran out of attempts is resumed by a
// client's retry: parking stops the sweep, not the client.)
// It is a permanent failure too (errors.Is(err, ErrPermanent)): Retryable
// reports false, and a client that retries gets the same answer until an
// operator acts.
var ErrParked error = parkedError{}

type parkedError struct{}

func (parkedError) Error() string {
	return "atomicphase: the request failed permanently and is parked for an operator; retrying it changes nothing"
}
func (parkedError) Is(target error) bool { return target == ErrPermanent }

// ErrOutcomeUnknown means a foreign call to a downstream without
// idempotency keys (a phase with WithReconcile) may or may not have taken
// effect, and reconciliation has not told yet: the call failed after it may
// have been sent, or the reconcile function could not answer. The key is
// marked unknown and left for the sweep, a client retry or ResolveUnknown to
// reconcile; nothing will send the call again before reconciliation shows
// it did not take effect. A client should retry later (409 over HTTP).
var ErrOutcomeUnknown = errors.New("atomicphase: outcome of a foreign call unknown")

// outcomeUnknown wraps err, the failure that left a call's outcome unknown.
func outcomeUnknown(err error) error { return &unknownError{err} }

type unknownError struct{ err error }

func (e *unknownError) Error() string        { return ErrOutcomeUnknown.Error() + ": " + e.err.Error() }
func (e *unknownError) Unwrap() error        { return e.err }
func (e *unknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// ErrTooManyKeys means a new key was refused because its scope already has
// Config.MaxUnfinishedPerScope unfinished keys. The error is a
// *TooManyKeysError. Nothing was written; a retry once some of the scope's
// keys finish is processed.
var ErrTooManyKeys = errors.New("atomicphase: too many unfinished keys in this scope")

// TooManyKeysError is returned (wrapped as ErrTooManyKeys) when a scope has
// as many unfinished keys as Config.MaxUnfinishedPerScope allows.
type TooManyKeysError struct {
	// Limit is Config.MaxUnfinishedPerScope.
	Limit int
	// RetryAfter is how long a client should wait before retrying.
	RetryAfter time.Duration
}

// Error names the limit.
func (e *TooManyKeysError) Error() string {
	return fmt.Sprintf("%s (limit %d; retry after %s)", ErrTooManyKeys.Error(), e.Limit, e.RetryAfter)
}

// Is reports whether target is ErrTooManyKeys.
func (e *TooManyKeysError) Is(target error) bool { return target == ErrTooManyKeys }

// InProgressError is returned (wrapped as ErrInProgress) when another attempt
// holds the key's lock.
type InProgressError struct {
	// RetryAfter is how long a client should wait before retrying: one
	// second, or less when the lock goes stale sooner.
	RetryAfter time.Duration
	// LockExpiresIn is how long until the current holder's lock goes stale
	// and a retry may take the key over.
	LockExpiresIn time.Duration
	// Err, when set, says why the key is held elsewhere: its workflow
	// version runs in another deployment, which the retry (through the
	// load balancer) or that deployment's sweep reaches.
	Err error
}

// Error describes the conflict and the retry-after hint.
func (e *InProgressError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%v (retry after %s)", e.Err, e.RetryAfter)
	}
	return fmt.Sprintf("%s (retry after %s)", ErrInProgress.Error(), e.RetryAfter)
}

// Unwrap returns Err.
func (e *InProgressError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// PhaseError wraps an error returned (or a transient database error met) by a
// phase. The phase's transaction was rolled back, the key was unlocked and
// nothing was stored: a retry resumes at this phase.
type PhaseError struct {
	Workflow string
	Phase    string
	Err      error
	// Parked is true when the failure parked the key: it was permanent, or
	// the key's last allowed attempt (Config.MaxAttempts).
	Parked bool
}

// Error names the workflow and phase and includes the phase's error.
func (e *PhaseError) Error() string {
	return fmt.Sprintf("atomicphase: workflow %q phase %q: %v", e.Workflow, e.Phase, e.Err)
}

// Unwrap returns the phase's own error.
func (e *PhaseError) Unwrap() error { return e.Err }

// Permanent marks err as an error no retry can fix (see ErrPermanent). A
// phase returns Permanent(err) for a failure that would only repeat: the key
// is parked for an operator instead of being retried. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// Retryable reports whether a client that got err from Run may send the same
// request again with the same key and hope for another answer. It is false
// for nil and for the final answers, which a retry of the same request can
// only repeat: ErrInvalidKey, ErrInvalidScope, ErrInvalidRequest,
// ErrFingerprintMismatch and ErrPermanent.
// It is true for everything else: a key in progress (ErrInProgress), a lock
// lost to a newer attempt (ErrLockLost), an unreachable store
// (ErrStoreUnavailable), a phase that failed and rolled back (*PhaseError),
// a cancelled context. Test code, the HTTP adapter and clients that drive
// Run directly all decide with it, so there is one answer to the question.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	return !errors.Is(err, ErrInvalidKey) &&
		!errors.Is(err, ErrInvalidScope) &&
		!errors.Is(err, ErrInvalidRequest) &&
		!errors.Is(err, ErrPermanent) &&
		!errors.Is(err, ErrFingerprintMismatch)
}

// Answer fails a phase as a transient error does, and gives the client
// status and body as the attempt's answer: for a foreign phase whose
// downstream refused definitively and confirmed it created nothing, when the
// workflow wants the client to be able to try again. The phase's
// transaction rolls back, nothing is stored, the key is released for a
// retry as after any transient failure (not parked by the refusal itself;
// Config.MaxAttempts still bounds the attempts), and Run returns a
// *PhaseError wrapping an *AnswerError, which Retryable reports retryable;
// the HTTP adapter writes the answer instead of its generic 503. To end the
// request with a refusal for good, stored and replayed, respond with it
// instead (Respond from the record step). err says why, for the key's last
// error and the log; status must be 400-599.
func Answer(status int, body []byte, err error) error {
	if err == nil {
		err = fmt.Errorf("answered %d", status)
	}
	if status < 400 || status > 599 {
		return Permanent(fmt.Errorf("atomicphase: Answer(%d): the status of a failure answer must be 400-599: %w", status, err))
	}
	return &AnswerError{Response: Response{Status: status, Body: body}, Err: err}
}

// AnswerError is a transient failure that carries the answer the client
// gets for it (see Answer).
type AnswerError struct {
	// Response is the answer: its status, body and any headers. It is not
	// stored.
	Response Response
	// Err is why the phase failed.
	Err error
}

// Error is Err's text.
func (e *AnswerError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *AnswerError) Unwrap() error { return e.Err }
