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
type LocalFunc[S any] func(ctx context.Context, tx pgx.Tx, state *S) (Outcome, error)

// CallFunc is the foreign half of a foreign phase. It runs with no
// transaction and no pooled connection held, and must make its one call
// through call (ForeignCall.Do or ForeignCall.Transport), which carries the
// downstream idempotency key. It records what the call returned in state; a
// returned error is transient (nothing stored, the retry repeats the call with
// the same downstream key).
type CallFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) error

// Phase is one step of a Workflow: one database transaction holding at most
// one foreign side effect. Build phases with Local and Foreign.
type Phase[S any] struct {
	name        string
	local       LocalFunc[S]
	call        CallFunc[S]
	isolation   pgx.TxIsoLevel
	jumps       []string
	formerNames []string
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
