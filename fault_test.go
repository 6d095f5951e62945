package atomicphase_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// TestFaultPlacesInTheOrderARunPassesThem records the fault points a real run
// passes and checks FaultPlaces against them. The workflow's last phase is a
// foreign phase whose record function responds, so it passes every
// phase-scoped place; with the run's own places before it, that is the whole
// list, in order.
func TestFaultPlacesInTheOrderARunPassesThem(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var passed []atomicphase.FaultPoint
	b := setup(t, &atomicphase.Config{FaultInjector: atomicphase.FaultInjectorFunc(
		func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			mu.Lock()
			defer mu.Unlock()
			passed = append(passed, at)
			return nil
		})})
	phases := []atomicphase.Phase[struct{}]{
		atomicphase.Local("prepare", noop),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, _ *struct{}) error {
			return call.Do(ctx, func(context.Context, string) error { return nil })
		}, respondOK),
	}
	// With phase fusion (the default) the key is recorded in prepare's
	// transaction, and there is no after-acquire: prepare's commit is it.
	fused := atomicphase.MustWorkflow("pay", startEmpty[struct{}], phases, nil)
	_, err := b.runner.Run(b.ctx, fused, atomicphase.Request{Scope: "u", Key: "fused", Method: "POST", Path: "/pay"})
	require.NoError(t, err)
	require.Equal(t, []atomicphase.FaultPoint{
		{Workflow: "pay", Place: atomicphase.BeforeAcquire},
		{Workflow: "pay", Phase: "prepare", Place: atomicphase.BeforePhase},
		{Workflow: "pay", Phase: "prepare", Place: atomicphase.BeforeCommit},
		{Workflow: "pay", Phase: "prepare", Place: atomicphase.AfterCommit},
		{Workflow: "pay", Phase: "charge", Place: atomicphase.BeforePhase},
		{Workflow: "pay", Phase: "charge", Place: atomicphase.AfterForeign},
		{Workflow: "pay", Phase: "charge", Place: atomicphase.BeforeResponse},
		{Workflow: "pay", Phase: "charge", Place: atomicphase.BeforeCommit},
		{Workflow: "pay", Phase: "charge", Place: atomicphase.AfterCommit},
	}, passed)
	passed = nil

	wf := atomicphase.MustWorkflow("pay", startEmpty[struct{}], phases, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	other, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{FaultInjector: atomicphase.FaultInjectorFunc(
		func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			mu.Lock()
			defer mu.Unlock()
			passed = append(passed, at)
			return nil
		})})
	require.NoError(t, err)
	_, err = other.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/pay"})
	require.NoError(t, err)

	byPhase := map[string][]atomicphase.FaultPlace{}
	for _, p := range passed {
		require.Equal(t, "pay", p.Workflow)
		byPhase[p.Phase] = append(byPhase[p.Phase], p.Place)
	}
	require.Equal(t, []atomicphase.FaultPlace{atomicphase.BeforePhase, atomicphase.BeforeCommit, atomicphase.AfterCommit},
		byPhase["prepare"], "a local phase that continues")
	require.Equal(t, atomicphase.FaultPlaces(), append(byPhase[""], byPhase["charge"]...),
		"the run's places, then a responding foreign phase's, are every place in FaultPlaces order")
}
