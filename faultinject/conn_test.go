package faultinject_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

// TestLoseCommitAckDoesNotRepeatThePhase: the COMMIT lands but its answer
// is lost; the retry sees the advanced recovery point and runs the phase no
// second time. Marked as a retry (as aphttp's client marks it), it reads its
// key before any phase; unmarked, the phase's code runs ahead of the read
// and nothing of it is kept: one order, one charge either way.
func TestLoseCommitAckDoesNotRepeatThePhase(t *testing.T) {
	t.Parallel()
	for _, marked := range []bool{true, false} {
		t.Run(fmt.Sprintf("marked=%v", marked), func(t *testing.T) {
			t.Parallel()
			loseCommitAckThenRetry(t, marked)
		})
	}
}

func loseCommitAckThenRetry(t *testing.T, marked bool) {
	opts := *shopDB
	opts.PoolConfig = func(cfg *pgxpool.Config) { faultinject.InstallDialer(cfg.ConnConfig) }
	db := atomicphasetest.NewDB(t, &opts)
	payments := newPayments(t)
	inj := faultinject.New(faultinject.Rule{Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.LoseCommitAck})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	wf := testshop.Workflow(payments.URL, db.Pool, testshop.Sound)
	ctx := context.Background()

	_, err = runner.Run(ctx, wf, testshop.Request())
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe, "the client saw a broken connection")
	require.Equal(t, "create_order", pe.Phase)
	info, err := runner.Inspect(ctx, "customer_1", "order-123")
	require.NoError(t, err)
	require.Equal(t, "create_order", info.RecoveryPoint, "the COMMIT reached the server")
	require.False(t, info.Locked)

	req := testshop.Request()
	req.Retry = marked
	resp, err := runner.Run(ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	creates := 0
	for _, p := range inj.Passed() {
		if p.Point.Phase == "create_order" && p.Point.Place == atomicphase.BeforePhase {
			creates++
		}
	}
	if marked {
		require.Equal(t, 1, creates, "the retry did not run create_order again")
	}
	require.NoError(t, testshop.Check(ctx, db.Pool, payments, resp.Body))
}

func TestLoseCommitAckNeedsTheDialer(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB) // connections not dialed through InstallDialer
	inj := faultinject.New(faultinject.Rule{Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.LoseCommitAck})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	_, err = runner.Run(context.Background(), testshop.Workflow("http://unused", db.Pool, testshop.Sound), testshop.Request())
	require.ErrorContains(t, err, "InstallDialer")
}
