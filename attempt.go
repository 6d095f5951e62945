package atomicphase

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// attempt is one Run or Resume that holds a key's lock. It is made only once
// acquisition has taken the key, from the row acquisition returned, and runs
// the key's workflow from the stored recovery point until a phase responds or
// fails.
type attempt struct {
	r     *Runner
	wf    AnyWorkflow
	scope string
	key   string
	// token is the lock token this acquisition got; every commit checks it.
	token int64
	// args are scope, key and token boxed once for the key's statements
	// (keystore.KeyArgs), for a key this attempt records; zero otherwise.
	args keystore.KeyArgs
	// salt is the key row's downstream salt ("" on rows older than it).
	salt string
	// attempts counts the acquisitions of the key, this one included.
	attempts int
	// fresh is true while no earlier attempt can have called the phase
	// about to run: the key was recorded by this attempt, or this attempt
	// committed the phase before it. A phase with a reconcile function is
	// reconciled first unless fresh.
	fresh bool
	// resolve, when set, stands in for the reconcile function of the first
	// phase this attempt resumes into (ResolveUnknown).
	resolve func(state []byte) (bool, []byte, error)
	// resumedFrom is the recovery point the attempt resumed at, which an
	// operator's recorded verdict names (Runner.RecordResolution).
	resumedFrom string
	// rec is the key's recording while it rides, uncommitted, in the first
	// unit's transaction (phase fusion); nil once committed, and for keys
	// acquired on their own.
	rec *keystore.Recording
	// assumed prepares by name the statements of the batch that assumes
	// rec's key is new (assume_prepare.go); nil for none.
	assumed *assumedStatements
	// conn is a connection already in hand, for the first unit.
	conn *pgxpool.Conn
	// leaseFrom is the local time the last statement that started or
	// renewed the key's lease was sent (lease.go); zero while the key rides,
	// unrecorded, in the first unit's transaction.
	leaseFrom time.Time
	// paid is set once a foreign call of the key may have gone out: this
	// attempt reached a foreign phase's call (or the reconciliation of an
	// earlier attempt's), or the key resumed past a foreign phase. A data
	// refusal then parks the key (failUnit): the client must not be told
	// to send the request again; and a release records it (called_at), so
	// that no forget or reap gives the key up while it is unfinished.
	paid bool
	// budget, when set, bounds each phase's function, call and commit (the
	// sweep's resumes: a phase that hangs must not stall the sweep, while a
	// long workflow whose phases each fit is finished).
	budget time.Duration
}

// newAttempt makes the attempt for a key acquisition took, from the row it
// returned.
func newAttempt(r *Runner, wf AnyWorkflow, scope, key string, row *keystore.Row, leaseFrom time.Time) *attempt {
	// attempts is 1 only for the acquisition that recorded the key: a
	// takeover or a Resume counts on from the row's own count.
	a := &attempt{r: r, wf: wf, scope: scope, key: key, token: row.LockToken, attempts: row.Attempts, fresh: row.Attempts == 1,
		resumedFrom: row.RecoveryPoint, leaseFrom: leaseFrom}
	if row.DownstreamSalt != nil {
		a.salt = *row.DownstreamSalt
	}
	return a
}

// phaseResult says where the workflow goes after a committed phase.
type phaseResult struct {
	resp    *Response // set when the phase responded
	nextIdx int       // the index of the phase to run next
	state   []byte
}

// run runs the workflow's phases from the row's recovery point until one
// responds or fails.
func (a *attempt) run(ctx context.Context, row *keystore.Row) (resp *Response, err error) {
	defer a.parkOnPanic(ctx)
	if row.RecoveryPoint != RecoveryPointStarted {
		a.log(ctx, slog.LevelInfo, "atomicphase: resuming key", "recovery_point", row.RecoveryPoint, "attempt", a.attempts)
	}
	if err := a.fault(ctx, "", AfterAcquire, nil); err != nil {
		return nil, a.fail(ctx, "", err)
	}
	var jumpTarget string
	if row.JumpTarget != nil {
		jumpTarget = *row.JumpTarget
	}
	idx, err := a.wf.resumeAt(row.RecoveryPoint, jumpTarget)
	if err != nil {
		return nil, a.fail(ctx, "", Permanent(err))
	}
	a.paid = mayHaveCalled(a.wf.phaseSteps(), idx, row)
	return a.loop(ctx, idx, row.State)
}

// mayHaveCalled reports whether a foreign call of the key that resumes at
// phase idx of steps may have gone out before this attempt: a foreign
// phase before idx committed (jumps go forward only, so the phases
// committed are among those before idx; which of them ran, the row does
// not say), or, when an earlier attempt ran (row.Attempts > 1), the
// foreign phase at idx, which that attempt may have called before it died
// or failed without committing. An attempt gets no further than that
// without moving the recovery point.
func mayHaveCalled(steps []step, idx int, row *keystore.Row) bool {
	if idx < len(steps) && steps[idx].call != nil && row.Attempts > 1 {
		return true
	}
	if row.RecoveryPoint == RecoveryPointStarted {
		return false
	}
	for _, st := range steps[:min(idx, len(steps))] {
		if st.call != nil {
			return true
		}
	}
	return false
}

// parkOnPanic, deferred, parks the key when the attempt panics. A panic is
// a bug that a retry would meet again: the key is parked with the panic and
// its stack, where an operator sees it, and the panic goes on. A client
// retry still resumes it (after the fix, say).
func (a *attempt) parkOnPanic(ctx context.Context) {
	p := recover()
	if p == nil {
		return
	}
	a.parkAfterPanic(ctx, p)
	panic(p)
}

// loopNew runs the workflow of a key this attempt records with its first
// unit, from its first phase. A panic parks the key and goes on, as in
// run; but when the key turns out to be another request's (recorded while
// this one's first unit ran, before it knew), the panic, of code run
// before that was known, is not this request's: it is answered by found
// (as run answers a key it finds), which lets the panic go on only for a
// key that does not exist after all.
func (a *attempt) loopNew(ctx context.Context, state []byte, found func(p any) (*Response, error)) (resp *Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			if a.parkAfterPanic(ctx, p) {
				panic(p)
			}
			resp, err = found(p)
		}
	}()
	return a.loop(ctx, 0, state)
}

// parkAfterPanic lets go of what the attempt holds after its code panicked
// with p: the connection it was handed and not yet used, then the key,
// parked with the panic and its stack. It reports false, parking nothing,
// when the key turns out not to be this attempt's (another request
// recorded it while this one's first unit, riding unrecorded, ran).
func (a *attempt) parkAfterPanic(ctx context.Context, p any) (ours bool) {
	if a.conn != nil {
		a.conn.Release()
		a.conn = nil
	}
	why := fmt.Errorf("panic: %v\n%s", p, debug.Stack())
	if ours, _ := a.recordAlone(ctx); !ours {
		return false
	}
	if released, perr := a.r.release(ctx, a.scope, a.key, a.token, why, 0, parkFinal, false, a.paid); perr != nil {
		a.log(ctx, slog.LevelError, "atomicphase: parking after a panic failed", "error", perr)
	} else if released {
		a.r.observe(ctx, Event{Kind: EventParked, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Err: why})
	}
	return true
}
