package atomicphasetest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

// createOrder is a phase function under test: it queues its insert and
// answers with the order's item.
func createOrder(ctx context.Context, tx atomicphase.Tx, o *testshop.Order) (atomicphase.Outcome, error) {
	if o.Item == "" {
		return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("no item"))
	}
	tx.Queue(`INSERT INTO orders (item) VALUES ($1)`, o.Item)
	return atomicphase.Respond(201, []byte(o.Item)), nil
}

func countOrders(t *testing.T, db *atomicphasetest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	return n
}

// TestRunPhaseCommitsQueuedWrites: a phase function called directly gets a
// real phase transaction; its queued insert commits with it, and its
// outcome can be inspected.
func TestRunPhaseCommitsQueuedWrites(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	out, err := atomicphasetest.RunPhase(t, db, createOrder, &testshop.Order{Item: "boots"})
	require.NoError(t, err)
	resp, ok := out.Response()
	require.True(t, ok)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, "boots", string(resp.Body))
	require.Equal(t, 1, countOrders(t, db))
}

// TestRunPhaseRollsBackAFailedPhase: a phase that fails writes nothing, and
// the error is the phase's.
func TestRunPhaseRollsBackAFailedPhase(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	_, err := atomicphasetest.RunPhase(t, db, createOrder, &testshop.Order{})
	require.ErrorContains(t, err, "no item")
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.Zero(t, countOrders(t, db))
}

// TestPhaseTxEndReportsWhatTheRunnerWould: the failures a phase's function
// cannot see on its own — a queued statement failing at commit, a COMMIT it
// swallowed — are End's answer, and nothing commits.
func TestPhaseTxEndReportsWhatTheRunnerWould(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	ctx := context.Background()

	pt := atomicphasetest.BeginPhase(t, db)
	pt.Tx.Queue(`INSERT INTO orders (item) VALUES ('a')`)
	pt.Tx.Queue(`INSERT INTO orders (item) VALUES (NULL)`) // item is NOT NULL
	require.ErrorContains(t, pt.End(nil), "not-null")
	require.Zero(t, countOrders(t, db))

	pt = atomicphasetest.BeginPhase(t, db)
	_, _ = pt.Tx.Exec(ctx, `INSERT INTO orders (item) VALUES ('a')`)
	_, _ = pt.Tx.Exec(ctx, `COMMIT`)
	require.ErrorIs(t, pt.End(nil), atomicphase.ErrPhaseTxControl)
	require.Zero(t, countOrders(t, db))
}

// TestPhaseTxFlushShowsQueuedWritesInside: Flush sends what was queued, so
// the test reads it inside the transaction; rolled back, it is gone.
func TestPhaseTxFlushShowsQueuedWritesInside(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	ctx := context.Background()
	pt := atomicphasetest.BeginPhase(t, db)
	_, err := createOrder(ctx, pt.Tx, &testshop.Order{Item: "boots"})
	require.NoError(t, err)
	require.NoError(t, pt.Flush(ctx))
	var n int
	require.NoError(t, pt.Tx.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n))
	require.Equal(t, 1, n, "inside the transaction")
	require.Zero(t, countOrders(t, db), "not committed yet")
	require.Error(t, pt.End(errors.New("the test rolls it back")))
	require.Zero(t, countOrders(t, db))
}

// TestBeginPhaseLeftOpenIsRolledBack: a test that never ends its phase
// transaction does not leak it: cleanup rolls it back.
func TestBeginPhaseLeftOpenIsRolledBack(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	t.Run("left open", func(t *testing.T) {
		pt := atomicphasetest.BeginPhase(t, db)
		pt.Tx.Queue(`INSERT INTO orders (item) VALUES ('a')`)
		require.NoError(t, pt.Flush(context.Background()))
	})
	require.Zero(t, countOrders(t, db))
}
