package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// The database roles: a role gets nothing through the library's SQL that
// its own grants do not give it (docs/security-and-limits.md, "Database
// roles"). Each test here migrates as the test server's superuser, then
// attacks another scope's key as a role with no grant at all and as one
// that may write the key table and nothing else.

// roleTest is a migrated database with a victim: a parked key of scope
// "victim", with history, that the roles attack.
type roleTest struct {
	*testBundle
	schema string
}

const victimScope, victimKey = "victim", "k1"

func setupRoleTest(t *testing.T) *roleTest {
	t.Helper()
	b := setup(t, nil)
	var schema string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&schema))
	type st struct{}
	wf := atomicphase.MustWorkflow("victim", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("bad request"))
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: victimScope, Key: victimKey, Method: "POST", Path: "/victim"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	rt := &roleTest{testBundle: b, schema: schema}
	require.Equal(t, atomicphase.KeyParked, rt.victimStatus(t))
	require.NotEmpty(t, rt.victimHistory(t), "the victim has a history to forge and erase")
	return rt
}

// victimStatus is the victim's state as the Runner reads it.
func (rt *roleTest) victimStatus(t *testing.T) atomicphase.KeyStatus {
	t.Helper()
	info, err := rt.runner.Inspect(rt.ctx, victimScope, victimKey)
	require.NoError(t, err)
	return info.Status
}

// victimHistory is the victim's history as the console shows it.
func (rt *roleTest) victimHistory(t *testing.T) []string {
	t.Helper()
	h, err := rt.runner.KeyHistory(rt.ctx, victimScope, victimKey, 0)
	require.NoError(t, err)
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = fmt.Sprintf("%s %s>%s", e.Event, e.StatusBefore, e.Status)
	}
	return out
}

// newRole creates a login role, made with grants (each a GRANT's object
// and privileges, "SELECT ON t", run as the superuser), and returns a
// connection as it. The role is dropped when the test ends.
func (rt *roleTest) newRole(t *testing.T, name string, grants ...string) *pgx.Conn {
	t.Helper()
	role := fmt.Sprintf("%s_%d", name, time.Now().UnixNano())
	_, err := rt.db.Pool.Exec(rt.ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = rt.db.Pool.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = rt.db.Pool.Exec(ctx, `DROP ROLE `+role)
	})
	for _, g := range grants {
		on, privs, _ := strings.Cut(g, " TO ")
		_, err := rt.db.Pool.Exec(rt.ctx, `GRANT `+privs+` ON `+on+` TO `+role)
		require.NoError(t, err, g)
	}
	cfg, err := pgx.ParseConfig(rt.db.URL)
	require.NoError(t, err)
	cfg.User = role
	conn, err := pgx.ConnectConfig(rt.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// triggerFunctions lists the trigger functions in the key table's schema,
// as regprocedure names them.
func (rt *roleTest) triggerFunctions(t *testing.T) []string {
	t.Helper()
	rows, err := rt.db.Pool.Query(rt.ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = $1::regnamespace AND p.prorettype = 'trigger'::regtype ORDER BY 1`, rt.schema)
	require.NoError(t, err)
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return fns
}

// attack is what a role tries with a temporary table of its own shaped
// like the key table, holding the victim's row: each of the schema's
// trigger functions attached to it, for an update (forging an event and a
// status: the copy of the parked victim made running) and for a delete
// under a forced forget (erasing the victim's history); and a column of a
// type of its own whose implicit cast, a function of its own, would run
// as whoever evaluates the column, and tries to make the role superuser.
// It reports the statements that succeeded, which must have done nothing
// to the victim (the caller checks).
func (rt *roleTest) attack(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	ctx := rt.ctx
	var role string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_user`).Scan(&role))
	// The victim's row, handed to the role as a table it may read (the
	// role's own grants might not let it read the key table).
	bait := "bait_" + role
	_, err := rt.db.Pool.Exec(ctx, `CREATE TABLE `+bait+` AS SELECT * FROM `+rt.schema+`.idempotency_keys
		WHERE scope = $1 AND idempotency_key = $2`, victimScope, victimKey)
	require.NoError(t, err)
	_, err = rt.db.Pool.Exec(ctx, `GRANT SELECT ON `+bait+` TO `+role)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = rt.db.Pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+bait) })

	setupSQL := []string{
		`CREATE TEMP TABLE ran_as (who text)`,
		`CREATE TYPE pg_temp.evil AS (x integer)`,
		`CREATE FUNCTION pg_temp.evil_int(pg_temp.evil) RETURNS integer LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO pg_temp.ran_as VALUES (current_user);
			BEGIN
				EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);
			EXCEPTION WHEN insufficient_privilege THEN
				NULL;
			END;
			RETURN 1;
		END $$`,
		`CREATE CAST (pg_temp.evil AS integer) WITH FUNCTION pg_temp.evil_int(pg_temp.evil) AS IMPLICIT`,
		`CREATE TEMP TABLE fake AS SELECT * FROM ` + bait,
		`CREATE TEMP TABLE fake_cast AS SELECT * FROM ` + bait,
		`ALTER TABLE fake_cast ALTER COLUMN response_status TYPE pg_temp.evil USING ROW(1)::pg_temp.evil`,
	}
	for _, sql := range setupSQL {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var done []string
	try := func(sql string) {
		if _, err := conn.Exec(ctx, sql); err == nil {
			done = append(done, sql)
		}
	}
	for i, fn := range rt.triggerFunctions(t) {
		name := strings.TrimSuffix(fn, "()")
		for _, table := range []string{"fake", "fake_cast"} {
			try(fmt.Sprintf(`CREATE TRIGGER t%d_u AFTER UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, i, table, name))
			try(fmt.Sprintf(`CREATE TRIGGER t%d_d AFTER DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, i, table, name))
		}
	}
	for _, table := range []string{"fake", "fake_cast"} {
		try(`UPDATE ` + table + ` SET locked_at = now(), parked_at = NULL, status = 'parked', last_error = 'forged'`)
		try(`BEGIN; SET LOCAL atomicphase.forget_forced = 'on'; DELETE FROM ` + table + `; COMMIT`)
		_, _ = conn.Exec(ctx, `ROLLBACK`)
	}
	var ranAs []string
	rows, err := conn.Query(ctx, `SELECT DISTINCT who FROM pg_temp.ran_as`)
	require.NoError(t, err)
	ranAs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, who := range ranAs {
		require.Equal(t, role, who, "the role's own function ran as %s", who)
	}
	var super bool
	require.NoError(t, rt.db.Pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super))
	require.False(t, super, "the role made itself superuser")
	return done
}

// victimUntouched checks the victim is as setupRoleTest left it.
func (rt *roleTest) victimUntouched(t *testing.T, history []string, msg string) {
	t.Helper()
	require.Equal(t, history, rt.victimHistory(t), "%s: the victim's history changed", msg)
	require.Equal(t, atomicphase.KeyParked, rt.victimStatus(t), "%s: the victim's state changed", msg)
}

// No function of the library's runs as its owner, after any migration and
// from schema.sql: a role's statements run as the role, so its grants are
// all it has.
func TestNoFunctionRunsAsItsOwner(t *testing.T) {
	t.Parallel()
	definers := func(db *atomicphasetest.DB) []string {
		rows, err := db.Pool.Query(t.Context(), `SELECT p.oid::regprocedure::text FROM pg_proc p
			JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')
			  AND n.nspname NOT LIKE 'pg\_%' AND n.nspname NOT IN ('citus', 'citus_internal', 'columnar', 'columnar_internal')
			ORDER BY 1`)
		require.NoError(t, err)
		fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return fns
	}
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	for _, m := range migrations(t, nil) {
		_, err := atomicphase.Migrate(t.Context(), db.Pool, &atomicphase.MigrateOpts{TargetVersion: m.Version, Contract: m.Contract})
		require.NoError(t, err)
		require.Empty(t, definers(db), "after migration %03d", m.Version)
	}
	atomicphasetest.SkipOnCitus(t, "schema.sql is applied to a plain PostgreSQL")
	file := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	applySchemaFile(t, file)
	require.Empty(t, definers(file), "from schema.sql")
}

// A role with no grant at all gets nothing from the library's functions:
// it cannot attach them to a table of its own to write another scope's
// history or state, erase a history, or run its own code as their owner;
// not even once a careless grant lets it attach them.
func TestARoleWithNoGrantGetsNothing(t *testing.T) {
	t.Parallel()
	rt := setupRoleTest(t)
	history := rt.victimHistory(t)
	stranger := rt.newRole(t, "stranger")

	done := rt.attack(t, stranger)
	for _, sql := range done {
		require.NotContains(t, sql, "CREATE TRIGGER", "a role with no grant attached a library function to its table")
	}
	rt.victimUntouched(t, history, "no grant")

	for _, fn := range rt.triggerFunctions(t) {
		_, err := rt.db.Pool.Exec(rt.ctx, `GRANT EXECUTE ON FUNCTION `+fn+` TO PUBLIC`)
		require.NoError(t, err)
	}
	careless := rt.newRole(t, "careless")
	rt.attack(t, careless)
	rt.victimUntouched(t, history, "EXECUTE granted")

	var n int
	require.NoError(t, rt.db.Pool.QueryRow(rt.ctx, `SELECT count(*) FROM `+rt.schema+`.atomicphase_key_history`).Scan(&n))
	_, err := stranger.Exec(rt.ctx, `INSERT INTO `+rt.schema+`.atomicphase_key_history
		(scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token)
		VALUES ('victim', 'k1', 'failed', 'running', 'waiting', 'started', 1, 1)`)
	require.Error(t, err, "a role with no grant wrote a history")
}

// A role that may write the key table, and nothing else, gets what that
// grant gives and no more: no history of its own making (no grant on it),
// no erased history, no code run as another role.
func TestARoleThatMayWriteOnlyTheKeyTableGetsNoMore(t *testing.T) {
	t.Parallel()
	rt := setupRoleTest(t)
	history := rt.victimHistory(t)
	writer := rt.newRole(t, "writer", rt.schema+".idempotency_keys TO SELECT, INSERT, UPDATE, DELETE")

	rt.attack(t, writer)
	rt.victimUntouched(t, history, "temporary table")

	// Its own writes of the key table write no history on its behalf:
	// parked moved to waiting, and a forced forget's delete.
	_, err := writer.Exec(rt.ctx, `UPDATE `+rt.schema+`.idempotency_keys SET parked_at = NULL, last_error = 'forged'
		WHERE scope = $1 AND idempotency_key = $2`, victimScope, victimKey)
	if err == nil {
		require.Equal(t, history, rt.victimHistory(t), "the writer's update wrote a history it may not write")
	}
	_, err = writer.Exec(rt.ctx, `BEGIN; SET LOCAL atomicphase.forget_forced = 'on';
		DELETE FROM `+rt.schema+`.idempotency_keys WHERE scope = 'victim' AND idempotency_key = 'k1'; COMMIT`)
	_, _ = writer.Exec(rt.ctx, `ROLLBACK`)
	if err != nil {
		rt.victimUntouched(t, history, "forced forget refused")
	}
	var n int
	require.NoError(t, rt.db.Pool.QueryRow(rt.ctx, `SELECT count(*) FROM `+rt.schema+`.atomicphase_key_history
		WHERE scope = $1 AND idempotency_key = $2`, victimScope, victimKey).Scan(&n))
	require.Equal(t, len(history), n, "the writer erased the victim's history")
	_, err = writer.Exec(rt.ctx, `INSERT INTO `+rt.schema+`.atomicphase_key_history
		(scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token)
		VALUES ('victim', 'k1', 'failed', 'running', 'waiting', 'started', 1, 1)`)
	require.Error(t, err, "a role with no grant on the history wrote one")
}

// A role that wrote the key table before the history existed (a previous
// release's, running while this one rolls out) keeps writing it: the
// migration that adds the history grants it there what its writes of the
// key table, through the library's functions, now need.
func TestTheHistorysMigrationGrantsItToTheKeyTablesWriters(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the coordinator connects to the workers as the role it is set to, which needs a login there")
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	ctx := t.Context()
	_, err := atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{TargetVersion: 16})
	require.NoError(t, err)
	role := fmt.Sprintf("old_writer_%d", time.Now().UnixNano())
	for _, sql := range []string{`CREATE ROLE ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO ` + role,
		`INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at, lock_token)
			VALUES ('driver_1', 'k', 'w', '\x00', 'POST', '/', '\x00', now(), 7)`} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	_, err = atomicphase.Migrate(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, sql := range []string{`SET LOCAL ROLE ` + role,
			`SELECT atomicphase_release('driver_1', 'k', 7, 'down', NULL, true, false, true, false)`} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
		return nil
	}))
	var events int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM atomicphase_key_history WHERE idempotency_key = 'k'`).Scan(&events))
	require.Equal(t, 1, events)
}

// runtimeGrants are the statements docs/security-and-limits.md gives the
// runtime role, for role in schema.
func runtimeGrants(t *testing.T, schema, role string) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("docs", "security-and-limits.md"))
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)## Database roles\n.*?```sql\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, block, "docs/security-and-limits.md gives the runtime role's grants in a sql block")
	sql := strings.NewReplacer("app_runtime", role, "public.", schema+".", "SCHEMA public", "SCHEMA "+schema).Replace(string(block[1]))
	var out []string
	for _, stmt := range strings.Split(sql, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// The runtime role's grants, as the docs give them, are enough for every
// kind of statement the library sends: a request that succeeds, one that
// fails and is retried, one parked, the operators' actions, the sweep and
// the reapers, the versions registry, the console's reads.
func TestARuntimeRoleWithTheDocumentedGrantsRunsEverything(t *testing.T) {
	t.Parallel()
	rt := setupRoleTest(t)
	role := fmt.Sprintf("app_runtime_%d", time.Now().UnixNano())
	_, err := rt.db.Pool.Exec(rt.ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = rt.db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = rt.db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	for _, stmt := range runtimeGrants(t, rt.schema, role) {
		_, err := rt.db.Pool.Exec(rt.ctx, stmt)
		require.NoError(t, err, stmt)
	}
	cfg, err := pgxpool.ParseConfig(rt.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(rt.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{LockTimeout: time.Minute})
	require.NoError(t, err)
	ctx := rt.ctx
	require.NoError(t, runner.CheckSchema(ctx))

	var failing atomic.Int32
	type st struct{}
	wf := atomicphase.MustWorkflow("runtime", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return atomicphase.Continue(), err
		}),
		atomicphase.Local("second", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			switch failing.Load() {
			case 1:
				return atomicphase.Outcome{}, errors.New("transient")
			case 2:
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("bad"))
			}
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	require.NoError(t, runner.Register(wf))
	require.NoError(t, runner.RecordVersions(ctx))
	req := func(key string) atomicphase.Request {
		return atomicphase.Request{Scope: "app", Key: key, Method: "POST", Path: "/runtime"}
	}
	resp, err := runner.Run(ctx, wf, req("fine"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	resp, err = runner.Run(ctx, wf, req("fine"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)

	failing.Store(1)
	_, err = runner.Run(ctx, wf, req("retried"))
	require.Error(t, err)
	failing.Store(0)
	resp, err = runner.Run(ctx, wf, req("retried"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)

	failing.Store(2)
	_, err = runner.Run(ctx, wf, req("parked"))
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	failing.Store(0)
	require.NoError(t, runner.Unpark(ctx, "app", "parked"))
	sweeper, err := atomicphase.NewSweeper(runner, nil)
	require.NoError(t, err)
	_, err = sweeper.RunOnce(ctx)
	require.NoError(t, err)
	info, err := runner.Inspect(ctx, "app", "parked")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "the sweep finished the unparked key")
	history, err := runner.KeyHistory(ctx, "app", "parked", 0)
	require.NoError(t, err)
	require.NotEmpty(t, history)

	require.NoError(t, runner.RecordAudit(ctx, &atomicphase.AuditEntry{Scope: "app", Key: "fine", Actor: "ops", Action: "note", Note: "checked"}))
	trail, err := runner.AuditTrail(ctx, "app", "fine", 10)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	_, err = runner.ReapAudit(ctx, time.Hour)
	require.NoError(t, err)
	require.NoError(t, runner.ForgetForced(ctx, victimScope, victimKey, "ops", "given up"))
	require.NoError(t, runner.Forget(ctx, "app", "retried"))
	_, err = runner.Reap(ctx, 0, 10, 1)
	require.NoError(t, err)
	_, err = runner.ReapParked(ctx, 0, 10)
	require.NoError(t, err)
	keys, err := runner.ListKeys(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, keys, "the reaper deleted the finished keys")
	_, err = runner.KeyLevels(ctx, nil)
	require.NoError(t, err)
	_, err = runner.Versions(ctx)
	require.NoError(t, err)
}
