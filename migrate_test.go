package atomicphase_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestSchemaFileMatchesMigrations(t *testing.T) {
	t.Parallel()
	schema, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	var ups []string
	for _, m := range atomicphase.Migrations(nil) {
		ups = append(ups, m.Up)
	}
	require.True(t, strings.HasSuffix(string(schema), strings.Join(ups, "\n")),
		"schema.sql must end with the up migrations, in order; regenerate it with `make schema`")
}

func TestMigrateIsIdempotentAndConcurrencySafe(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	ctx := t.Context()

	var wg sync.WaitGroup
	applied := make([][]int, 8)
	errs := make([]error, 8)
	for i := range applied {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = atomicphase.Migrate(ctx, db.Pool, nil)
		}()
	}
	wg.Wait()
	total := 0
	for i := range applied {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	require.Equal(t, len(atomicphase.Migrations(nil)), total, "each migration is applied exactly once")

	again, err := atomicphase.Migrate(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, again)

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&n))
}

func TestMigrationsGoDownAndUpAgain(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	ctx := t.Context()
	migrations := atomicphase.Migrations(nil)
	for i := len(migrations) - 1; i >= 0; i-- {
		_, err := db.Pool.Exec(ctx, migrations[i].Down)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, "DELETE FROM atomicphase_migration")
	require.NoError(t, err)
	_, err = atomicphase.Migrate(ctx, db.Pool, nil)
	require.NoError(t, err)
}

func TestSchemaFileAppliesOnItsOwn(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	schema, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	_, err = db.Pool.Exec(t.Context(), string(schema))
	require.NoError(t, err)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	wf := atomicphase.MustWorkflow("one", []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(context.Context, pgx.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	resp, err := runner.Run(t.Context(), wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
}
