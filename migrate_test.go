package atomicphase_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

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
	require.Equal(t, len(migrations(t, nil)), total, "each migration is applied exactly once")

	again, err := atomicphase.Migrate(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, again)

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&n))
}

func TestMigrationsGoDownAndUpAgain(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "it cannot plan migration 003's down check, EXISTS (SELECT FROM a distributed table) with an empty select list")
	db := atomicphasetest.NewDB(t, nil)
	ctx := t.Context()
	migrations := migrations(t, nil)
	for i := len(migrations) - 1; i >= 0; i-- {
		_, err := db.Pool.Exec(ctx, migrations[i].Down)
		require.NoError(t, err)
	}
	require.Empty(t, schemaObjects(t, db.Pool, "public"), "the down migrations remove everything but the ledger")
	_, err := db.Pool.Exec(ctx, "DELETE FROM atomicphase_migration")
	require.NoError(t, err)
	applied, err := atomicphase.Migrate(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, migrationVersions(t), applied)
	require.Equal(t, allObjects, schemaObjects(t, db.Pool, "public"))
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, runner.CheckSchema(ctx))
}

// allObjects is what the migrations create, as schemaObjects lists it.
var allObjects = []string{
	"function atomicphase_acquire", "function atomicphase_admit", "function atomicphase_admit", "function atomicphase_checkpoint",
	"function atomicphase_claim", "function atomicphase_held_until", "function atomicphase_key_delete", "function atomicphase_key_event",
	"function atomicphase_key_table_fired", "function atomicphase_lock_expires", "function atomicphase_lock_takeable",
	"function atomicphase_record", "function atomicphase_record", "function atomicphase_record", "function atomicphase_record_first",
	"function atomicphase_record_resolution", "function atomicphase_record_unit", "function atomicphase_record_verdict",
	"function atomicphase_refuse", "function atomicphase_release", "function atomicphase_release", "function atomicphase_release",
	"function atomicphase_renew", "function atomicphase_schedule", "function atomicphase_stale_before", "function atomicphase_state_name",
	"function atomicphase_take", "function atomicphase_unpark", "table atomicphase_audit", "table atomicphase_key_history", "table atomicphase_releases",
	"table atomicphase_sweep_watermark", "table atomicphase_workflow_versions", "table idempotency_keys",
}

// schemaObjects lists the atomicphase tables and functions in schema, from
// pg_catalog, leaving out the migration ledger and the tests' own tables.
func schemaObjects(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'table ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r'
		  AND (c.relname = 'idempotency_keys' OR c.relname LIKE 'atomicphase\_%') AND c.relname <> 'atomicphase_migration'
		UNION ALL
		SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname LIKE 'atomicphase\_%'
		ORDER BY 1`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func migrationVersions(t testing.TB) []int {
	var vs []int
	for _, m := range migrations(t, nil) {
		vs = append(vs, m.Version)
	}
	return vs
}

// TestLaterMigrationsGoDownAndUpAgain takes every migration after 001 out,
// newest first, under a database with keys in it, and puts them back: the
// keys survive both ways, and the schema check tells the two states apart.
func TestLaterMigrationsGoDownAndUpAgain(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "it cannot plan migration 003's down check, EXISTS (SELECT FROM a distributed table) with an empty select list")
	b := setup(t, nil)
	migrations := migrations(t, nil)
	require.GreaterOrEqual(t, len(migrations), 3)
	require.Equal(t, "stale_lock_rule", migrations[1].Name)
	wf := atomicphase.MustWorkflow("one", startEmpty[struct{}], []atomicphase.Phase[struct{}]{atomicphase.Local("only", respondOK)}, nil)
	req := func(key string) atomicphase.Request {
		return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/"}
	}
	_, err := b.runner.Run(b.ctx, wf, req("before"))
	require.NoError(t, err)
	allObjects := schemaObjects(t, b.db.Pool, "public")

	var later []int
	for i := len(migrations) - 1; i >= 1; i-- {
		_, err = b.db.Pool.Exec(b.ctx, migrations[i].Down)
		require.NoError(t, err, "migration %03d down", migrations[i].Version)
		later = append([]int{migrations[i].Version}, later...)
	}
	require.NotContains(t, schemaObjects(t, b.db.Pool, "public"), "function atomicphase_stale_before")
	require.NotContains(t, schemaObjects(t, b.db.Pool, "public"), "function atomicphase_lock_takeable")
	err = b.runner.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	require.ErrorContains(t, err, "atomicphase_stale_before")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE response_status = 200`), "keys survive")

	_, err = b.db.Pool.Exec(b.ctx, "DELETE FROM atomicphase_migration WHERE version > 1")
	require.NoError(t, err)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.NoError(t, err)
	require.Equal(t, later, applied)
	require.NoError(t, b.runner.CheckSchema(b.ctx))
	require.Equal(t, allObjects, schemaObjects(t, b.db.Pool, "public"))
	resp, err := b.runner.Run(b.ctx, wf, req("before"))
	require.NoError(t, err)
	require.True(t, resp.Replayed, "the key recorded before went down and up with the schema")
	resp, err = b.runner.Run(b.ctx, wf, req("after"))
	require.NoError(t, err)
	require.False(t, resp.Replayed)
}

func TestMigrationsRenderSchema(t *testing.T) {
	t.Parallel()
	for _, opts := range []*atomicphase.MigrateOpts{nil, {}, {Schema: "x"}} {
		for _, m := range migrations(t, opts) {
			for _, sql := range []string{m.Up, m.Down} {
				require.NotEmpty(t, sql)
				require.NotContains(t, sql, "/* TEMPLATE", "migration %03d for %+v", m.Version, opts)
				if opts != nil && opts.Schema == "x" {
					require.Contains(t, sql, `"x".`, "migration %03d names the schema", m.Version)
				} else {
					require.NotContains(t, sql, `"x".`)
				}
			}
		}
	}
	up := migrations(t, &atomicphase.MigrateOpts{Schema: "x"})[0].Up
	for _, name := range []string{`"x".idempotency_keys`, `"x".atomicphase_acquire`, `"x".atomicphase_checkpoint`} {
		require.Contains(t, up, name)
	}
	require.NotRegexp(t, `(?m)(CREATE TABLE|CREATE FUNCTION|FROM|INTO|UPDATE) +idempotency_keys`, up, "no name is left unqualified")
}

// TestMigrateIntoSchema checks in pg_catalog that MigrateOpts.Schema puts
// every object, the ledger included, in that schema and nothing on the
// search_path, and that the down migrations rendered for it take them out.
func TestMigrateIntoSchema(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	ctx := t.Context()
	opts := &atomicphase.MigrateOpts{Schema: "billing"}
	applied, err := atomicphase.Migrate(ctx, db.Pool, opts)
	require.NoError(t, err)
	require.Equal(t, migrationVersions(t), applied)

	require.Equal(t, allObjects, schemaObjects(t, db.Pool, "billing"))
	require.Empty(t, schemaObjects(t, db.Pool, "public"))
	rows, err := db.Pool.Query(ctx, "SELECT version FROM billing.atomicphase_migration ORDER BY version")
	require.NoError(t, err)
	ledger, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, migrationVersions(t), ledger)
	var publicLedger *string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regclass('public.atomicphase_migration')::text").Scan(&publicLedger))
	require.Nil(t, publicLedger, "the ledger lives in the schema too")

	again, err := atomicphase.Migrate(ctx, db.Pool, opts)
	require.NoError(t, err)
	require.Empty(t, again)

	migrations := migrations(t, opts)
	for i := len(migrations) - 1; i >= 0; i-- {
		_, err := db.Pool.Exec(ctx, migrations[i].Down)
		require.NoError(t, err)
	}
	require.Empty(t, schemaObjects(t, db.Pool, "billing"))
}

func TestMigrateRejectsAnOverlongSchema(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	long := strings.Repeat("s", 64)
	applied, err := atomicphase.Migrate(t.Context(), db.Pool, &atomicphase.MigrateOpts{Schema: long})
	require.ErrorContains(t, err, "MigrateOpts.Schema")
	require.ErrorContains(t, err, "longer than 63 bytes")
	require.Empty(t, applied)
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sss%'").Scan(&n))
	require.Zero(t, n, "nothing was created, not even a truncated schema")
}

// applySchemaFile applies schema.sql to db statement by statement, on one
// connection, as psql -f runs it.
func applySchemaFile(t *testing.T, db *atomicphasetest.DB) {
	t.Helper()
	schema, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	// One session, as psql -f has: a SET holds for the statements after it.
	conn, err := db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	for _, stmt := range atomicphase.SplitStatements(string(schema)) {
		_, err = conn.Exec(t.Context(), stmt)
		require.NoError(t, err, stmt)
	}
}

func TestSchemaFileAppliesOnItsOwn(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	applySchemaFile(t, db)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	wf := atomicphase.MustWorkflow("one", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	resp, err := runner.Run(t.Context(), wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
}

// Migrating below 003 while unfinished keys have downstream salts would let
// the older code repeat their calls under other keys: the down migration
// refuses.
func TestMigration003DownRefusesWhileSaltedKeysAreUnfinished(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "it cannot plan migration 003's down check, EXISTS (SELECT FROM a distributed table) with an empty select list")
	b := setup(t, nil)
	type st struct{}
	wf := atomicphase.MustWorkflow("unfinished", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, errors.New("transient")
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.Error(t, err)
	migrations := migrations(t, nil)
	for i := len(migrations) - 1; migrations[i].Version > 3; i-- {
		_, err = b.db.Pool.Exec(b.ctx, migrations[i].Down)
		require.NoError(t, err)
	}
	_, err = b.db.Pool.Exec(b.ctx, migrations[2].Down)
	require.ErrorContains(t, err, "let them finish")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE downstream_salt IS NOT NULL`), "nothing changed")
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
	_, err = b.db.Pool.Exec(b.ctx, migrations(t, nil)[0].Up)
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
	require.Zero(t, c.charge.Load()+c.finish.Load(), "no phase after the first ran, no foreign call")
	require.Zero(t, b.count(t, "SELECT count(*) FROM effects"), "nothing of the first reached the database")

	_, err = b.runner.Resume(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	_, err = b.runner.Inspect(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)

	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err, "the same Runner works once the database is migrated")
}

// migrations is atomicphase.Migrations(opts), which must succeed.
func migrations(t testing.TB, opts *atomicphase.MigrateOpts) []atomicphase.Migration {
	t.Helper()
	ms, err := atomicphase.Migrations(opts)
	require.NoError(t, err)
	return ms
}

// Every entry point that renders SQL refuses what Migrate and NewRunner
// refuse: a schema name holding $ (the function bodies are dollar-quoted,
// so text after it would run as SQL) or naming a system schema.
func TestEveryRendererAppliesTheSchemaNameRules(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"x$$; CREATE TABLE public.injected(); $$", "pg_catalog", "tab\tx\x01"} {
		ms, err := atomicphase.Migrations(&atomicphase.MigrateOpts{Schema: schema})
		require.Error(t, err, schema)
		require.Nil(t, ms, "nothing is rendered for %q", schema)
		stmts, err := atomicphase.CitusDistribution(schema)
		require.Error(t, err, schema)
		require.Nil(t, stmts, "nothing is rendered for %q", schema)
		_, err = atomicphase.NewRunner(nil, &atomicphase.Config{Schema: schema})
		require.Error(t, err)
	}
}
