package atomicphase_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// unreachablePool is a pool whose every connection attempt fails: nothing
// listens on port 1.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestRunStoreUnavailableRunsNothing(t *testing.T) {
	t.Parallel()
	runner, err := atomicphase.NewRunner(unreachablePool(t), nil)
	require.NoError(t, err)

	var c counters
	foreign := 0
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		foreign++
		return nil
	}})
	_, err = runner.Run(context.Background(), wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.Zero(t, c.create.Load()+c.charge.Load()+c.finish.Load())
	require.Zero(t, foreign)
}

func TestCheckSchemaOnAMigratedDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.NoError(t, b.runner.CheckSchema(b.ctx))
}

func TestCheckSchemaNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	err := b.runner.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	for _, missing := range []string{"idempotency_keys", "atomicphase_acquire", "atomicphase_checkpoint",
		"atomicphase_stale_before", "atomicphase_lock_takeable"} {
		require.ErrorContains(t, err, missing)
	}
	require.ErrorContains(t, err, "run atomicphase.Migrate")
	require.False(t, errors.Is(err, atomicphase.ErrStoreUnavailable), "the store answered: %v", err)

	// Half a schema: only what is missing is named.
	_, err = b.db.Pool.Exec(b.ctx, atomicphase.Migrations(nil)[0].Up)
	require.NoError(t, err)
	err = b.runner.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	require.ErrorContains(t, err, "atomicphase_stale_before")
	require.ErrorContains(t, err, "atomicphase_lock_takeable")
	require.NotContains(t, err.Error(), "idempotency_keys,", "the table is there")
	require.ErrorContains(t, err, "idempotency_keys.unknown_at", "a column a later migration adds is not")
	require.ErrorContains(t, err, "atomicphase_acquire(", "001's acquire has an older signature")
}

func TestCheckSchemaStoreUnavailable(t *testing.T) {
	t.Parallel()
	runner, err := atomicphase.NewRunner(unreachablePool(t), nil)
	require.NoError(t, err)
	err = runner.CheckSchema(context.Background())
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.False(t, errors.Is(err, atomicphase.ErrSchemaMissing))
}

// TestUnmigratedDatabaseIsSchemaMissing checks that every entry point meeting
// a database without the schema says so (ErrSchemaMissing, with how to fix
// it) rather than passing on PostgreSQL's "does not exist".
func TestUnmigratedDatabaseIsSchemaMissing(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})

	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	require.ErrorContains(t, err, "atomicphase.Migrate")
	require.False(t, errors.Is(err, atomicphase.ErrStoreUnavailable))
	require.Zero(t, c.create.Load()+c.charge.Load()+c.finish.Load(), "no phase ran")

	_, err = b.runner.Resume(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	_, err = b.runner.Inspect(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)

	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err, "the same Runner works once the database is migrated")
}
