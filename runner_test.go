package atomicphase_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestRegisterRefusesAnotherWorkflowWithTheSameName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	require.NoError(t, b.runner.Register(orderWorkflow(t, &c, hooks{})))
	require.ErrorContains(t, b.runner.Register(orderWorkflow(t, &c, hooks{})), "already registered")
}

func TestTypedNilWorkflowIsAnErrorNotAPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wf *atomicphase.Workflow[struct{}]
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "nil workflow")
	require.ErrorContains(t, b.runner.Register(wf), "nil workflow")
}
