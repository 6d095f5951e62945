package atomicphasetest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/atomicphase/atomicphase"
)

// PhaseTx is the transaction a local phase function receives, on a test
// database, for a unit test that calls the function directly: the real
// atomicphase.Tx, with Queue's batching, its refusal of transaction control
// and its savepoints, opened by a Runner on a key of its own. Pass Tx to
// the function, then End the transaction: committing it sends the queued
// writes with the commit, as the Runner does after a phase.
//
//	pt := atomicphasetest.BeginPhase(t, db)
//	out, err := createOrder(ctx, pt.Tx, &order)
//	require.NoError(t, pt.End(err)) // commits, or rolls back when err != nil
//	resp, ok := out.Response()
//
// RunPhase does all three for a LocalFunc. A PhaseTx is for one goroutine
// at a time, as a phase's Tx is.
type PhaseTx struct {
	// Tx is the phase's transaction, to pass to the phase function. Its
	// Commit and Rollback refuse, as in a phase: End ends it.
	Tx atomicphase.Tx

	end  chan error // the test's verdict, to the phase
	done chan error // the Runner's answer
	once sync.Once
	err  error
}

// errAbandoned ends a PhaseTx its test never ended.
var errAbandoned = errors.New("atomicphasetest: the test ended without PhaseTx.End: rolled back")

// BeginPhase opens a phase transaction on db (which needs the atomicphase
// schema: Options.SkipMigrations unset) and returns it. The transaction
// begins lazily, with the first statement sent, as a phase's does. A test
// that never calls End has it rolled back when the test ends.
func BeginPhase(t testing.TB, db *DB) *PhaseTx {
	t.Helper()
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{PhaseRetries: -1})
	if err != nil {
		t.Fatalf("atomicphasetest: BeginPhase: %v", err)
	}
	pt := &PhaseTx{end: make(chan error), done: make(chan error, 1)}
	handed := make(chan atomicphase.Tx)
	var calls int
	// The phase hands its Tx to the test and waits for End. The Runner
	// would call it again after a conflict on commit; with PhaseRetries
	// off it does not, but a second call must not wait for a second End.
	phase := func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
		if calls++; calls > 1 {
			return atomicphase.Outcome{}, errors.New("atomicphasetest: a phase under test runs once")
		}
		handed <- tx
		if err := <-pt.end; err != nil {
			return atomicphase.Outcome{}, err
		}
		return atomicphase.Respond(204, nil), nil
	}
	start := func(struct{}, *atomicphase.Request) (struct{}, error) { return struct{}{}, nil }
	wf, err := atomicphase.NewWorkflow("atomicphasetest_phase", start, []atomicphase.Phase[struct{}]{
		atomicphase.Local("phase_under_test", phase),
	}, nil)
	if err != nil {
		t.Fatalf("atomicphasetest: BeginPhase: %v", err)
	}
	go func() {
		_, err := runner.Run(context.Background(), wf, atomicphase.Request{
			Scope: "atomicphasetest", Key: "phase-" + randomHex(8), Method: "POST", Path: "/phase",
		})
		pt.done <- err
	}()
	select {
	case pt.Tx = <-handed:
	case err := <-pt.done:
		t.Fatalf("atomicphasetest: BeginPhase: the phase never ran: %v", err)
	}
	t.Cleanup(func() { _ = pt.End(errAbandoned) })
	return pt
}

// End ends the transaction as the Runner ends a phase's: with phaseErr nil
// it commits, sending the queued statements first in the same round trip;
// otherwise it rolls back. It returns the error the phase fails with, as a
// *atomicphase.PhaseError: phaseErr itself; a queued statement that failed;
// transaction control the Tx refused, or a COMMIT sent through Conn, even
// if the function swallowed the error. Nil means everything committed.
// Later calls return the first one's answer.
func (pt *PhaseTx) End(phaseErr error) error {
	pt.once.Do(func() {
		pt.end <- phaseErr
		pt.err = <-pt.done
	})
	return pt.err
}

// Flush sends the statements queued so far, inside the transaction, so
// that the test can read (through Tx) what they wrote before ending it.
func (pt *PhaseTx) Flush(ctx context.Context) error {
	_, err := pt.Tx.Exec(ctx, "SELECT")
	return err
}

// RunPhase calls fn with a phase transaction on db and state, and ends it as
// the Runner would (End): committed when fn succeeds, its queued writes
// with it. It returns fn's outcome, for the test to inspect
// (Outcome.Continues, JumpTarget, Response), and the error the phase fails
// with, nil when it committed.
func RunPhase[S any](t testing.TB, db *DB, fn atomicphase.LocalFunc[S], state *S) (atomicphase.Outcome, error) {
	t.Helper()
	pt := BeginPhase(t, db)
	out, err := fn(context.Background(), pt.Tx, state)
	return out, pt.End(err)
}
