package atomicphase

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LocalFunc is the body of a phase that only touches the database. It runs
// inside the phase's transaction: everything it writes through tx commits
// together with the phase's recovery point and the updated state, or not at
// all. tx must not be committed or rolled back by the function (those calls
// return ErrPhaseTxControl). A returned error is transient: the transaction
// rolls back, the key is unlocked and a retry runs the phase again.
//
// Write with tx.Queue when the phase does not need a statement's result:
// queued writes travel with the commit, and cost no round trip of their own.
type LocalFunc[S any] func(ctx context.Context, tx Tx, state *S) (Outcome, error)

// Tx is the transaction a phase's database work runs in. It is a pgx.Tx
// whose statements run at once (Exec, Query, QueryRow and the rest), plus
// Queue, for writes whose results the phase does not need.
//
// Consecutive local phases, and a foreign phase's record step with the local
// phases after it, share one transaction (see Workflow): what one of them
// wrote, the next one reads.
type Tx interface {
	pgx.Tx

	// Queue adds a statement to the transaction without sending it. Queued
	// statements are sent in order, together with whatever is sent next on
	// the transaction: the phase's next immediate statement, or its commit,
	// pipelined in the same round trip. A queued statement that fails fails
	// the phase (at that next send, or at commit) and rolls the transaction
	// back. Its result (rows, rows affected) is discarded: use Exec or
	// QueryRow for a statement whose result matters.
	Queue(sql string, args ...any)
}

// CallFunc is the foreign half of a foreign phase. It runs with no
// transaction and no pooled connection held, and must make its one call
// through call (ForeignCall.Do or ForeignCall.Transport), which carries the
// downstream idempotency key. It records what the call returned in state; a
// returned error is transient (nothing stored, the retry repeats the call with
// the same downstream key).
type CallFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) error

// ReconcileFunc asks a downstream without idempotency keys whether a
// foreign phase's call took effect: typically a lookup by a reference
// derived from call.Key(), which the call sent along. It returns happened
// true, having recorded the result in state as the call function would
// have, when the call took effect; false when it did not, so that the call
// may be made; and an error when it cannot tell (the lookup is down), which
// leaves the outcome unknown for a later try.
type ReconcileFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) (happened bool, err error)

// Phase is one step of a Workflow: one database transaction holding at most
// one foreign side effect. Build phases with Local and Foreign.
type Phase[S any] struct {
	name        string
	local       LocalFunc[S]
	call        CallFunc[S]
	isolation   pgx.TxIsoLevel
	jumps       []string
	formerNames []string
	reconcile   ReconcileFunc[S]
	fkRetries   int
}

// Local declares a phase that only touches the database.
func Local[S any](name string, fn LocalFunc[S]) Phase[S] {
	return Phase[S]{name: name, local: fn}
}

// Foreign declares a phase that makes one foreign call (call) and then
// records its result in a transaction (record, which may be nil when the
// state updated by call is all there is to record). The state and recovery
// point are committed with record's writes.
func Foreign[S any](name string, call CallFunc[S], record LocalFunc[S]) Phase[S] {
	return Phase[S]{name: name, call: call, local: record}
}

// WithIsolation returns a copy of p whose transaction runs at level instead
// of the workflow's isolation level (PostgreSQL's READ COMMITTED by default).
// Serialization failures and deadlocks are retried by the Runner.
func (p Phase[S]) WithIsolation(level pgx.TxIsoLevel) Phase[S] {
	p.isolation = level
	return p
}

// WithForeignKeyRetries returns a copy of p for which a foreign-key
// violation is a race worth retrying, for the key's first n attempts: the
// row the phase refers to may be committed by another request a moment
// later (an order and its customer created in parallel, say). By default a
// foreign-key violation, like every other violation of a constraint by the
// request's data, is the request's final answer (422, stored and replayed:
// a product that does not exist stays so on every retry); with n set, it
// is a transient failure (503) until the key's nth attempt, and the final
// 422 after. n must not be negative.
func (p Phase[S]) WithForeignKeyRetries(n int) Phase[S] {
	p.fkRetries = n
	return p
}

// WithJumps returns a copy of p that may return JumpTo with any of the named
// phases. Declaring jumps lets NewWorkflow check every edge of the workflow:
// targets must exist and come later than p, so a workflow always ends.
func (p Phase[S]) WithJumps(targets ...string) Phase[S] {
	p.jumps = append(append([]string(nil), p.jumps...), targets...)
	return p
}

// WithFormerNames returns a copy of p that also answers to names it had in
// earlier deployments, oldest first. A key's recovery point is a phase name;
// renaming or replacing a phase would otherwise strand every key stopped at
// the old name (a stored recovery point the workflow does not have is a
// permanent failure). Keys stopped at a former name resume after p.
//
// A foreign phase's downstream keys stay derived from its oldest name, so a
// call made before the rename and repeated after it carries the same key
// and the downstream deduplicates it. Give the names oldest first, and keep
// them.
func (p Phase[S]) WithFormerNames(names ...string) Phase[S] {
	p.formerNames = append(append([]string(nil), p.formerNames...), names...)
	return p
}

// WithReconcile returns a copy of a foreign phase p whose downstream has no
// idempotency keys (a bank transfer API, a legacy order system): a call it
// receives twice takes effect twice. The Runner then sends the call at most
// once unless reconcile has shown that it did not take effect:
//
//   - in the attempt that committed the previous phase (or recorded the key),
//     no call can have gone out before, and the call is made at once, at no
//     extra cost;
//   - an attempt that resumes into p (after a crash, a failure, or with the
//     sweep) asks reconcile first, and makes the call only if it did not
//     happen;
//   - a call that fails (a timeout, a lost answer, a 5xx that may have
//     executed) leaves the outcome unknown: the key records it, with when to
//     reconcile, and the attempt fails with ErrOutcomeUnknown (409 over
//     HTTP) rather than repeat the call.
//
// A call function that knows its call did not take effect (a 4xx refusal)
// records that in the state and returns nil, or returns Permanent. p must
// be a foreign phase.
func (p Phase[S]) WithReconcile(reconcile ReconcileFunc[S]) Phase[S] {
	p.reconcile = reconcile
	return p
}

// Name returns the phase's name, which is also its recovery point.
func (p Phase[S]) Name() string { return p.name }

// String describes the phase as "local phase \"name\"" or "foreign phase \"name\"".
func (p Phase[S]) String() string {
	kind := "local"
	if p.call != nil {
		kind = "foreign"
	}
	return fmt.Sprintf("%s phase %q", kind, p.name)
}
