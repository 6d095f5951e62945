package atomicphasetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

// TestAgeLocksMakesACrashedAttemptsLockStale: a crashed attempt's lock
// holds until the lock timeout; AgeLocks lets that time pass at once, and
// the retry takes the key over through the ordinary acquisition path.
func TestAgeLocksMakesACrashedAttemptsLockStale(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	payments, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = payments.Close() })
	inj := faultinject.New(faultinject.Rule{Phase: "create_order", Place: atomicphase.AfterCommit, Action: faultinject.Crash})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	ctx := context.Background()
	wf := testshop.Workflow(payments.URL, db.Pool, testshop.Sound)

	_, err = runner.Run(ctx, wf, testshop.Request())
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	_, err = runner.Run(ctx, wf, testshop.Request())
	require.ErrorIs(t, err, atomicphase.ErrInProgress)

	require.NoError(t, atomicphasetest.AgeLocks(ctx, db.Pool, atomicphase.DefaultLockTimeout))
	resp, err := runner.Run(ctx, wf, testshop.Request())
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.NoError(t, testshop.Check(ctx, db.Pool, payments, resp.Body))
}
