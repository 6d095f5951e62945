package atomicphase_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// Two values built by one constructor are one definition: both register,
// and both run (a handler that builds its workflow per request, say).
func TestRegisterAcceptsTheSameDefinitionTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	first, second := orderWorkflow(t, &c, hooks{}), orderWorkflow(t, &c, hooks{})
	require.NoError(t, b.runner.Register(first))
	require.NoError(t, b.runner.Register(second))
	_, err := b.runner.Run(b.ctx, second, orderRequest("u", "k"))
	require.NoError(t, err)
}

// A different definition under a taken name is refused, saying what
// differs.
func TestRegisterRefusesAnotherDefinitionWithTheSameNameAndVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v := &atomicphase.WorkflowOpts{Version: "2026-11"}
	one := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", respondOK),
	}, v)
	renamed := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("c", respondOK),
	}, v)
	longer := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", noop), atomicphase.Local("c", respondOK),
	}, v)
	kept := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", respondOK),
	}, &atomicphase.WorkflowOpts{Version: "2026-11", KeepFinishedState: true})
	require.NoError(t, b.runner.Register(one))
	err := b.runner.Register(renamed)
	require.ErrorContains(t, err, `another definition of workflow "same_name" version "2026-11" is already registered`)
	require.ErrorContains(t, err, `phase 1 "b"`)
	require.ErrorContains(t, err, `phase 1 "c"`)
	require.ErrorContains(t, b.runner.Register(longer), "3 phases")
	require.ErrorContains(t, b.runner.Register(kept), "KeepFinishedState true")
	_, err = b.runner.Run(b.ctx, renamed, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "already registered", "Run refuses it too, before anything is stored")

	// Without a declared version, each phase list is a version of its own,
	// and a Runner holds several: the keys of each resume under their own.
	derived := func(phases ...string) *atomicphase.Workflow[struct{}] {
		var ps []atomicphase.Phase[struct{}]
		for _, p := range phases {
			ps = append(ps, atomicphase.Local(p, noop))
		}
		ps[len(ps)-1] = atomicphase.Local(phases[len(phases)-1], respondOK)
		return atomicphase.MustWorkflow("derived", startEmpty[struct{}], ps, nil)
	}
	ab, ac, abc := derived("a", "b"), derived("a", "c"), derived("a", "b", "c")
	require.NotEqual(t, ab.Version(), ac.Version())
	require.NotEqual(t, ab.Version(), abc.Version())
	require.Equal(t, ab.Version(), derived("a", "b").Version(), "derived from the phase list alone")
	require.NoError(t, b.runner.Register(ab, ac, abc, derived("a", "b")))
}

// A phase renamed with WithFormerNames keeps the derived version: its keys
// resume under the new definition.
func TestRenameDeclaredKeepsTheVersion(t *testing.T) {
	t.Parallel()
	before := atomicphase.MustWorkflow("w", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", respondOK),
	}, nil)
	after := atomicphase.MustWorkflow("w", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b2", respondOK).WithFormerNames("b"),
	}, nil)
	undeclared := atomicphase.MustWorkflow("w", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b2", respondOK),
	}, nil)
	require.Equal(t, before.Version(), after.Version())
	require.NotEqual(t, before.Version(), undeclared.Version())
	_, err := atomicphase.NewWorkflow("w", startEmpty[struct{}], []atomicphase.Phase[struct{}]{atomicphase.Local("a", respondOK)},
		&atomicphase.WorkflowOpts{Version: "has space"})
	require.ErrorContains(t, err, "workflow version")
}

func TestTypedNilWorkflowIsAnErrorNotAPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wf *atomicphase.Workflow[struct{}]
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "nil workflow")
	require.ErrorContains(t, b.runner.Register(wf), "nil workflow")
}
