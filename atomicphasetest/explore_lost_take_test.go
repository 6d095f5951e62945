package atomicphasetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
)

type lostTakeSt struct{ N int }

// foreignFirst is a workflow whose first phase is foreign: its key is
// recorded by an acquisition, on a connection, so LoseTakeAck applies on
// the client's first attempt.
func foreignFirstScenario(sweep bool) atomicphasetest.Scenario {
	wf := atomicphase.MustWorkflow("ff", func(in struct{}, _ *atomicphase.Request) (lostTakeSt, error) { return lostTakeSt{}, nil },
		[]atomicphase.Phase[lostTakeSt]{
			atomicphase.Foreign("pay", func(context.Context, *atomicphase.ForeignCall, *lostTakeSt) error { return nil },
				func(context.Context, atomicphase.Tx, *lostTakeSt) (atomicphase.Outcome, error) {
					return atomicphase.Respond(201, []byte("ok")), nil
				}),
		}, nil)
	return atomicphasetest.Scenario{
		Name:    "foreign first",
		Sweep:   sweep,
		Actions: []faultinject.Action{faultinject.LoseTakeAck},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			return &atomicphasetest.Trial{Attempt: func(ctx context.Context, r *atomicphase.Runner) (*atomicphase.Response, error) {
				return r.Run(ctx, wf, atomicphase.Request{Scope: "s", Key: "k", Method: "POST", Path: "/p", Params: []byte(`{}`)})
			}}
		},
	}
}

// A lost answer to the acquisition of a workflow whose first phase is
// foreign (the key is recorded by a statement of its own), on the client's
// attempts and, with Scenario.Sweep, on the sweep's take: each time the
// explorer checks, before any lock is aged, that the key was unlocked by
// its token. (With that unlock removed from the library, both runs report
// the violation.)
func TestExploreLostTakeAnswers(t *testing.T) {
	t.Parallel()
	for _, sweep := range []bool{false, true} {
		rep := atomicphasetest.Explore(t, foreignFirstScenario(sweep))
		ran := 0
		for _, row := range rep.Rows[1:] {
			if len(row.Unfired) == 0 {
				ran++
			}
		}
		require.Positive(t, ran, "sweep=%v: lose-take-ack ran", sweep)
	}
}
