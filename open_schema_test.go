package atomicphase_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// A schema every role may create objects in (public, on PostgreSQL 14 and
// earlier) lets any role define a function or an operator that a statement
// matches more closely than the built-in one it means, and run its code as
// whoever sends the statement. Migrate refuses such a database unless told
// no untrusted role connects to it, and CheckSchema reports it, last.
func TestMigrateRefusesASchemaEveryRoleMayCreateIn(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the schema's grants are the coordinator's; the rule is a single node's")
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	require.NoError(t, err)

	applied, err := atomicphase.Migrate(ctx, db.Pool, nil)
	require.ErrorIs(t, err, atomicphase.ErrSchemaOpen)
	require.ErrorContains(t, err, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	require.Empty(t, applied)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'idempotency_keys'`).Scan(&tables))
	require.Zero(t, tables, "nothing was applied")

	// A schema of the library's own does not help while public, on the
	// search_path, stays open: its statements' built-in calls resolve
	// there too.
	_, err = atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{Schema: "keys"})
	require.ErrorIs(t, err, atomicphase.ErrSchemaOpen)

	_, err = atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{AllowPublicCreate: true})
	require.NoError(t, err)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	err = runner.CheckSchema(ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaOpen, "reported, last, for a caller that accepted it to accept")

	_, err = db.Pool.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	require.NoError(t, err)
	require.NoError(t, runner.CheckSchema(ctx))
}

// Where a database was migrated with every role allowed to create objects
// (MigrateOpts.AllowPublicCreate), the key table's own guard still names
// every operator with its schema: an operator a stranger planted for it,
// on the types it compares, never runs, when the migrating role deletes a
// parked key by hand.
func TestTheKeyTriggersCallNothingAStrangerCanPlant(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the schema's grants are the coordinator's; the rule is a single node's")
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	require.NoError(t, err)
	_, err = atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{AllowPublicCreate: true})
	require.NoError(t, err)

	role := fmt.Sprintf("planter_%d", time.Now().UnixNano())
	_, err = db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.User = role
	planter, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = planter.Close(context.Background()) })
	for _, sql := range []string{
		`CREATE TABLE public.ran_as (who text)`,
		`GRANT INSERT ON public.ran_as TO PUBLIC`,
		`CREATE FUNCTION public.planted_eq(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO public.ran_as VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$`,
		`CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.planted_eq)`,
		`CREATE FUNCTION public.planted_eq_type(oid, regtype) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO public.ran_as VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$`,
		`CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regtype, FUNCTION = public.planted_eq_type)`,
	} {
		_, err := planter.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, sql := range []string{
		`INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, parked_at, status)
			VALUES ('s', 'k', 'w', '\x00', 'POST', '/', '\x00', now(), 'p')`,
		`DELETE FROM idempotency_keys WHERE idempotency_key = 'k'`,
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var ran int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.ran_as`).Scan(&ran))
	require.Zero(t, ran, "the planted operator ran for the key table's guard")
}
