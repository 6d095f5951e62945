package atomicphase

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FaultPlace names a place in a run where a fault can be injected. The
// faultinject package builds on these; applications never need them.
type FaultPlace string

// The places a run passes, in order. Phase-scoped places are passed once per
// phase attempt.
const (
	// BeforeAcquire is passed before the key is recorded or locked: with
	// the connection that sends the statement that records or takes it
	// (an acquisition, the sweep's or Resume's take), or with none when the
	// key is new and recorded by its first phase's commit.
	BeforeAcquire FaultPlace = "before-acquire"
	// AfterAcquire is passed once the key is locked by this attempt.
	AfterAcquire FaultPlace = "after-acquire"
	// BeforePhase is passed before a phase's body runs.
	BeforePhase FaultPlace = "before-phase"
	// AfterForeign is passed after a foreign call returned (success or
	// error), before its phase commits, while the call's lease still runs
	// (a delay there is a slow answer, and the lease is renewed meanwhile).
	AfterForeign FaultPlace = "after-foreign"
	// BeforeCommit is passed when the phase's body is done and its
	// recovery point is about to be committed with its writes.
	BeforeCommit FaultPlace = "before-commit"
	// BeforeResponse is passed, just before BeforeCommit, by the phase
	// whose commit stores the response.
	BeforeResponse FaultPlace = "before-response"
	// AfterCommit is passed after a phase committed, before the next phase
	// (or, for the last phase, before Run returns the response).
	AfterCommit FaultPlace = "after-commit"
)

// FaultPlaces returns every fault place in the order a run passes them.
func FaultPlaces() []FaultPlace {
	return []FaultPlace{BeforeAcquire, AfterAcquire, BeforePhase, AfterForeign, BeforeResponse, BeforeCommit, AfterCommit}
}

// FaultPoint identifies one fault point: a place in a given phase of a given
// workflow. Phase is empty for BeforeAcquire and AfterAcquire.
type FaultPoint struct {
	Workflow string
	Phase    string
	Place    FaultPlace
}

// String renders the point as workflow:phase:place (phase omitted when
// empty), the form the faultinject package parses.
func (p FaultPoint) String() string {
	if p.Phase == "" {
		return p.Workflow + ":" + string(p.Place)
	}
	return p.Workflow + ":" + p.Phase + ":" + string(p.Place)
}

// FaultInjector is called by the Runner at every fault point when set in
// Config. conn is the connection the phase holds at that point (nil when it
// holds none); an injector may break it. A returned error fails the attempt
// as a phase error would, except that an error wrapping ErrCrashed stops the
// attempt dead: the Runner closes conn without commit, rollback or unlock and
// returns the error, exactly as a killed process would leave things.
type FaultInjector interface {
	InjectFault(ctx context.Context, at FaultPoint, conn *pgx.Conn) error
}

// FaultInjectorFunc adapts a function to FaultInjector.
type FaultInjectorFunc func(ctx context.Context, at FaultPoint, conn *pgx.Conn) error

// InjectFault calls f.
func (f FaultInjectorFunc) InjectFault(ctx context.Context, at FaultPoint, conn *pgx.Conn) error {
	return f(ctx, at, conn)
}

// fault passes a fault point to the configured injector: one nil check when
// there is none.
func (r *Runner) fault(ctx context.Context, workflow, phase string, place FaultPlace, conn *pgx.Conn) error {
	if r.cfg.FaultInjector == nil {
		return nil
	}
	return r.cfg.FaultInjector.InjectFault(ctx, FaultPoint{Workflow: workflow, Phase: phase, Place: place}, conn)
}

// fault passes the fault point place of phase (see Config.FaultInjector).
func (a *attempt) fault(ctx context.Context, phase string, place FaultPlace, conn *pgx.Conn) error {
	return a.r.fault(ctx, a.wf.Name(), phase, place, conn)
}

// crash leaves the connection as a killed process would: the socket is
// closed under the open transaction, with no COMMIT, ROLLBACK or unlock.
func crash(ctx context.Context, pc *pgxpool.Conn) {
	conn := pc.Hijack()
	_ = conn.PgConn().Conn().Close()
	_ = conn.Close(ctx)
}
