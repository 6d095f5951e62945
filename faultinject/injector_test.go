package faultinject_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

func TestInjectorRulesFireOnceAndMatchWildcards(t *testing.T) {
	t.Parallel()
	inj := faultinject.New(
		faultinject.Rule{Place: atomicphase.BeforeCommit, Action: faultinject.Error, Times: 2},
		faultinject.Rule{Workflow: "other", Place: atomicphase.AfterCommit, Action: faultinject.Error},
	)
	ctx := context.Background()
	at := atomicphase.FaultPoint{Workflow: "shop", Phase: "x", Place: atomicphase.BeforeCommit}
	require.ErrorIs(t, inj.InjectFault(ctx, at, nil), faultinject.ErrInjected)
	require.ErrorIs(t, inj.InjectFault(ctx, at, nil), faultinject.ErrInjected)
	require.NoError(t, inj.InjectFault(ctx, at, nil), "Times: 2 fires twice")
	require.NoError(t, inj.InjectFault(ctx, atomicphase.FaultPoint{Workflow: "shop", Place: atomicphase.AfterCommit}, nil))
	require.Equal(t, []int{2, 0}, inj.Fired())
	require.Len(t, inj.Passed(), 4)

	var nilInj *faultinject.Injector
	require.NoError(t, nilInj.InjectFault(ctx, at, nil), "a nil injector injects nothing")
	require.ErrorIs(t, faultinject.New(faultinject.Rule{Place: atomicphase.BeforeCommit, Action: faultinject.Crash}).
		InjectFault(ctx, at, nil), atomicphase.ErrCrashed)
}

func TestPanicActionPanicsWithThePoint(t *testing.T) {
	t.Parallel()
	at := atomicphase.FaultPoint{Workflow: "shop", Phase: "charge", Place: atomicphase.AfterForeign}
	inj := faultinject.New(faultinject.Rule{Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Panic})
	defer func() {
		p, ok := recover().(*faultinject.InjectedPanic)
		require.True(t, ok)
		require.Equal(t, at, p.At)
		require.Equal(t, "faultinject: injected panic at shop:charge:after-foreign", p.String())
	}()
	_ = inj.InjectFault(context.Background(), at, nil)
	t.Fatal("no panic")
}

func TestTerminateBackendBreaksTheConnection(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	payments := newPayments(t)
	inj := faultinject.New(faultinject.Rule{Phase: "confirm", Place: atomicphase.BeforeCommit, Action: faultinject.TerminateBackend})
	inj.Admin = db.Pool
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = runner.Run(ctx, testshop.Workflow(payments.URL, db.Pool, testshop.Sound), testshop.Request())
	require.Error(t, err)
	require.Contains(t, strings.ToLower(err.Error()), "terminat", "the driver met the terminated backend: %v", err)
	var count int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE charge_id IS NOT NULL`).Scan(&count))
	require.Zero(t, count, "confirm's write rolled back with its backend")
}

func TestTerminateBackendNeedsAdmin(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	inj := faultinject.New(faultinject.Rule{Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.TerminateBackend})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	_, err = runner.Run(context.Background(), testshop.Workflow("http://unused", db.Pool, testshop.Sound), testshop.Request())
	require.ErrorContains(t, err, "Injector.Admin")
}

func TestCrashLeavesTheKeyLocked(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	payments := newPayments(t)
	inj := faultinject.New(faultinject.Rule{Phase: "confirm", Place: atomicphase.BeforeCommit, Action: faultinject.Crash})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	ctx := context.Background()
	wf := testshop.Workflow(payments.URL, db.Pool, testshop.Sound)
	_, err = runner.Run(ctx, wf, testshop.Request())
	require.ErrorIs(t, err, atomicphase.ErrCrashed)

	_, err = runner.Run(ctx, wf, testshop.Request())
	require.ErrorIs(t, err, atomicphase.ErrInProgress, "the dead attempt still holds the key")
	require.NoError(t, atomicphasetest.AgeLocks(ctx, db.Pool, atomicphase.DefaultLockTimeout))
	resp, err := runner.Run(ctx, wf, testshop.Request())
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.NoError(t, testshop.Check(ctx, db.Pool, payments, resp.Body))
}
