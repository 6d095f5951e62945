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
func TestRegisterRefusesAnotherDefinitionWithTheSameName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	one := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", respondOK),
	}, nil)
	renamed := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("c", respondOK),
	}, nil)
	longer := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", noop), atomicphase.Local("c", respondOK),
	}, nil)
	kept := atomicphase.MustWorkflow("same_name", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", noop), atomicphase.Local("b", respondOK),
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true})
	require.NoError(t, b.runner.Register(one))
	err := b.runner.Register(renamed)
	require.ErrorContains(t, err, `another definition of workflow "same_name" is already registered`)
	require.ErrorContains(t, err, `phase 1 "b"`)
	require.ErrorContains(t, err, `phase 1 "c"`)
	require.ErrorContains(t, b.runner.Register(longer), "3 phases")
	require.ErrorContains(t, b.runner.Register(kept), "KeepFinishedState true")
	_, err = b.runner.Run(b.ctx, renamed, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "already registered", "Run refuses it too, before anything is stored")
}

func TestTypedNilWorkflowIsAnErrorNotAPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wf *atomicphase.Workflow[struct{}]
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "nil workflow")
	require.ErrorContains(t, b.runner.Register(wf), "nil workflow")
}
