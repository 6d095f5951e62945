package atomicphase

import (
	"context"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// KeyInfo is what Inspect reports about a key.
type KeyInfo struct {
	Scope    string
	Key      string
	Workflow string
	// WorkflowVersion is the version of the workflow's definition the key
	// started under, and resumes under (Workflow.Version); "" for a key
	// recorded before versions were.
	WorkflowVersion string
	RecoveryPoint   string
	// RequestMethod and RequestPath are the request's method and path as
	// first recorded, and Fingerprint the hash of the request it checks
	// every retry against.
	RequestMethod string
	RequestPath   string
	Fingerprint   []byte
	// Status is where the key stands: in progress, stale, abandoned,
	// unknown, parked or finished (KeyStatuses).
	Status KeyStatus
	// Locked is true while the key's lock is set, held by a live attempt
	// (Status KeyInProgress) or left by a dead or slow one (KeyStale).
	Locked bool
	// LockExpiresIn is how long until a held lock goes stale, in seconds;
	// negative once it has.
	LockExpiresIn *float64
	// LockToken is the token of the latest acquisition (drawn at random).
	LockToken int64
	// State is the workflow state as of the last committed phase, the JSON
	// bytes exactly as stored. It is nil once the key is finished, unless
	// the workflow keeps it (WorkflowOpts.KeepFinishedState).
	State []byte
	// Attempts counts the acquisitions that took the key.
	Attempts int
	// LastError is why the key's last failed attempt failed.
	LastError *string
	// NextAttemptAt is when the sweep may try the key again after a failed
	// attempt; nil when it may at once.
	NextAttemptAt *time.Time
	// UnknownAt is when the outcome of the key's foreign call became
	// unknown; nil unless it is.
	UnknownAt *time.Time
	// ResolvedHappened, ResolvedNote and ResolvedAt record the last verdict
	// an operator gave by hand (Runner.RecordResolution); nil if none.
	ResolvedHappened *bool
	ResolvedNote     *string
	ResolvedAt       *time.Time
	// ResolvedResult is the call's result recorded with the verdict
	// (Runner.RecordResolutionWithResult), as JSON; nil if none.
	ResolvedResult []byte
	// ParkedAt is when the key was parked (it failed permanently, or
	// Config.MaxAttempts times); nil unless it is.
	ParkedAt *time.Time
	// Unsettled is set while an unfinished key may have paid: the outcome
	// of its foreign call is unknown (UnknownAt), a call it was marked as
	// making may still be acted on by the downstream (CallUntil), or a
	// failed attempt knew a foreign call of it may have gone out
	// (CalledAt). Forget refuses such a key (ErrOutcomeUnsettled), and the
	// sweep does not reap it.
	Unsettled bool
	// ParkedForGood is set on a parked key that a permanent failure parked
	// (a bug in its code, a panic: LastError says which), not its
	// attempts running out: a client's retry is refused (ErrParked), and a
	// verdict (RecordResolution) or a webhook's resolution leaves it
	// parked until an operator unparks it.
	ParkedForGood bool
	// Paid is set on a finished key that may have made a foreign call: its
	// workflow version, as this Runner registered it, has a foreign phase,
	// or this Runner has not registered that version and cannot tell (an
	// operator's CLI or console, which has not the workflow's code).
	// Forget refuses such a key (ErrKeyPaid): the client's retry would run
	// as a new request, with new downstream keys, and pay again;
	// ForgetForced gives it up with a reason. The reaper, after the
	// retention, deletes it as any finished key.
	Paid bool
	// CallUntil is when the quiet period of the foreign call the key was
	// last marked as making ends (the lease plus Config.CallGrace); nil
	// when no call is marked.
	CallUntil *time.Time
	// CalledAt is when an attempt that failed knew that a foreign call of
	// the key may first have gone out (a call sent, a foreign phase
	// committed); nil when none did. It makes an unfinished key Unsettled.
	CalledAt *time.Time
	// DownstreamSalt salts the key's downstream keys: with the workflow,
	// scope, key and a foreign phase's oldest name it derives what the
	// downstream was sent ("" on rows older than it).
	DownstreamSalt string
	// DownstreamKeys are the downstream idempotency keys (ForeignCall.Key)
	// of the key's foreign phases, by phase name, the references a
	// downstream knows its calls by: filled by Inspect, ListKeys and the
	// bulk operations for workflows this Runner has registered (every
	// version's foreign phases), nil for others.
	DownstreamKeys map[string]string
	// Response is the stored response once the key is finished.
	Response   *Response
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
}

// KeyStatus is where a key stands.
type KeyStatus string

// The statuses of a key.
const (
	// KeyInProgress: an attempt holds the key's lock, and it is not stale,
	// or a foreign call's quiet period still holds the key after its
	// attempt ended (LockExpiresIn says until when).
	KeyInProgress KeyStatus = keystore.StatusInProgress
	// KeyStale: the key's lock is older than the lock timeout: its holder
	// died or is slow, and the next retry or sweep takes it over.
	KeyStale KeyStatus = keystore.StatusStale
	// KeyAbandoned: unfinished and unlocked: its last attempt failed (or
	// was cancelled), and a retry or the sweep resumes it.
	KeyAbandoned KeyStatus = keystore.StatusAbandoned
	// KeyUnknown: unfinished and unlocked, waiting for reconciliation: a
	// call to a downstream without idempotency keys may or may not have
	// taken effect. The sweep or a retry reconciles it after NextAttemptAt;
	// ResolveUnknown settles it from outside.
	KeyUnknown KeyStatus = keystore.StatusUnknown
	// KeyParked: unfinished, unlocked and left for an operator; the sweep
	// does not try it, a client retry still resumes it.
	KeyParked KeyStatus = keystore.StatusParked
	// KeyFinished: the response is stored and replayed.
	KeyFinished KeyStatus = keystore.StatusFinished
)

// KeyStatuses returns every KeyStatus, in the order a key may pass
// through them.
func KeyStatuses() []KeyStatus {
	return []KeyStatus{KeyInProgress, KeyStale, KeyAbandoned, KeyUnknown, KeyParked, KeyFinished}
}

// Inspect reads a key's stored row without locking or changing it, for
// operators and tests. A key never recorded returns ErrKeyNotFound.
func (r *Runner) Inspect(ctx context.Context, scope, key string) (*KeyInfo, error) {
	info, err := r.store.Inspect(ctx, r.poolFor(scope), scope, key)
	if err != nil {
		return nil, storeError("inspect key", err)
	}
	if info == nil {
		return nil, ErrKeyNotFound
	}
	return r.keyInfo(info), nil
}

// keyInfo is keyInfo with the key's downstream keys, for workflows this
// Runner registered, and for a finished key whether it may have paid.
func (r *Runner) keyInfo(in *keystore.Info) *KeyInfo {
	info := keyInfo(in)
	info.Paid = info.Response != nil && r.mayHaveCalled(info.Workflow, info.WorkflowVersion)
	for _, wf := range r.definitionsOf(in.Workflow) {
		for _, st := range wf.phaseSteps() {
			if st.call == nil {
				continue
			}
			if info.DownstreamKeys == nil {
				info.DownstreamKeys = map[string]string{}
			}
			if _, ok := info.DownstreamKeys[st.name]; !ok {
				info.DownstreamKeys[st.name] = downstreamKey(in.DownstreamSalt, in.Workflow, in.Scope, in.Key, st.downstreamName)
			}
		}
	}
	return info
}

// mayHaveCalled reports whether a key of version of workflow may have made
// a foreign call: the version, as this Runner registered it, has a foreign
// phase, or this Runner has not registered the version.
func (r *Runner) mayHaveCalled(workflow, version string) bool {
	for _, wf := range r.definitionsOf(workflow) {
		if wf.Version() != version {
			continue
		}
		for _, st := range wf.phaseSteps() {
			if st.call != nil {
				return true
			}
		}
		return false
	}
	return true
}

// keyInfo is the KeyInfo of a key's row as the key store read it.
func keyInfo(in *keystore.Info) *KeyInfo {
	info := &KeyInfo{
		Scope: in.Scope, Key: in.Key, Workflow: in.Workflow, RecoveryPoint: in.RecoveryPoint,
		RequestMethod: in.RequestMethod, RequestPath: in.RequestPath, Fingerprint: in.Fingerprint,
		Status: KeyStatus(in.Status), Locked: in.Locked, LockExpiresIn: in.LockExpiresIn, LockToken: in.LockToken,
		State: in.State, Attempts: in.Attempts, LastError: in.LastError, NextAttemptAt: in.NextAttemptAt,
		UnknownAt: in.UnknownAt, ResolvedHappened: in.ResolvedHappened, ResolvedNote: in.ResolvedNote,
		ResolvedAt: in.ResolvedAt, ResolvedResult: in.ResolvedResult, ParkedAt: in.ParkedAt, ParkedForGood: in.ParkedForGood,
		Unsettled: in.Unsettled, CallUntil: in.CallUntil, CalledAt: in.CalledAt, DownstreamSalt: in.DownstreamSalt,
		CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt, FinishedAt: in.FinishedAt,
	}
	if in.WorkflowVersion != nil {
		info.WorkflowVersion = *in.WorkflowVersion
	}
	if in.StatusCode != nil {
		info.Response = &Response{Status: *in.StatusCode, Header: in.Header, Body: in.Body, Replayed: true}
	}
	return info
}
