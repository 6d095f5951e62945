package atomicphase

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migration/*.sql
var migrationFS embed.FS

// Migration is one numbered schema change shipped with the package.
type Migration struct {
	// Version orders migrations; it is the number the file name starts with.
	Version int
	// Name is the rest of the file name, such as "idempotency_keys".
	Name string
	// Up is the SQL that applies the migration.
	Up string
	// Down is the SQL that reverts it.
	Down string
	// Contract marks a contract step: it removes what an older release
	// reads, so Migrate applies it only when asked (MigrateOpts.Contract),
	// or on a database it migrates from nothing, and refuses while a
	// process of such a release may still run.
	Contract bool
	// Needs, for a contract step, is the oldest migration a release may
	// need to keep working after it (its MinVersion): a process whose
	// release needs an older one is an older release's.
	Needs int
}

// MigrateOpts are optional settings of Migrate and Migrations. A nil
// *MigrateOpts means all defaults.
type MigrateOpts struct {
	// Schema is the PostgreSQL schema to put the key table, the functions
	// and the migration ledger in; Migrate creates it if it does not
	// exist. Give the Runner the same value in Config.Schema. Defaults to ""
	// (the first schema on the connection's search_path, usually public).
	Schema string

	// Citus, on a Citus coordinator, distributes the key table by scope
	// and the functions by their scope argument once the migrations are
	// applied (CitusDistribution; docs/scale.md): on every call, since a
	// migration may recreate a function. The citus extension must be
	// created, and the workers registered, first. Defaults to false.
	Citus bool

	// ScopeCap builds, once the migrations are applied, the index that
	// Config.MaxUnfinishedPerScope counts a scope's unfinished keys with
	// (keystore's idempotency_keys_unfinished_idx, concurrently, so no
	// write waits for it). Set it where any process caps scopes: without
	// the index the count reads every key a scope keeps, finished ones
	// included, and CheckSchema refuses a Runner with a cap. It is not
	// part of the default schema because every request pays for it: its
	// predicate reads the response status, so each finish writes an entry
	// in it instead of a HOT update (docs/operations.md). Like the
	// migrations, it needs db to be a *pgxpool.Pool or a *pgx.Conn.
	// Defaults to false; false never drops an index built before.
	ScopeCap bool

	// AllowPublicCreate lets Migrate apply the migrations to a database
	// where every role may create objects in the key table's schema or in
	// a schema on the connection's search_path (schema public, on
	// PostgreSQL 14 and earlier). Such a role can define a function or an
	// operator that a statement of the library's calls in place of the
	// built-in one it means, and run its own code as whoever sends that
	// statement: the migrating role, an operator, the role that runs
	// requests (docs/security-and-limits.md, "Database roles"). Migrate
	// refuses without it (ErrSchemaOpen); CheckSchema refuses such a
	// database too. Set it only for a database no untrusted role can
	// connect to. Defaults to false: revoke CREATE from PUBLIC instead
	// (REVOKE CREATE ON SCHEMA public FROM PUBLIC).
	AllowPublicCreate bool

	// TargetVersion, when positive, stops after that migration: the ones
	// after it are left for a later run. Defaults to 0 (every migration).
	TargetVersion int

	// Contract applies the contract steps too (Migration.Contract): the
	// migrations that remove what only an older release reads. Without it
	// Migrate applies the expand steps alone, which a previous release's
	// processes keep working on, so that a service may call Migrate at
	// start-up while an upgrade rolls out (docs/operations.md,
	// "Upgrades"); on a database it migrates from nothing, where no older
	// release can run, it applies every step. A contract step refuses,
	// changing nothing, while the versions registry has seen a process of
	// a release older than the step allows within LiveWithin
	// (ErrOlderReleaseLive). Defaults to false.
	Contract bool

	// LiveWithin is how recently a process must have been seen for a
	// contract step to count it as live: each process is seen at every
	// sweep, and one that runs no Sweeper when it records its versions
	// (Runner.RecordVersions). Defaults to 0, meaning
	// DefaultVersionHorizon.
	LiveWithin time.Duration
}

// MinVersion is the migration this version of the library needs the
// database to have reached: CheckSchema refuses an older schema. The
// migrations after it remove what only an older release reads.
const MinVersion = 19

func (o *MigrateOpts) schema() string {
	if o == nil {
		return ""
	}
	return o.Schema
}

// Migrations returns the package's migrations in version order, their SQL
// written for opts.Schema. Use it to feed your own migration tool, holding
// back each contract step (Migration.Contract) until no process of a
// release older than its Needs is left, as Migrate does; schema.sql holds
// the same SQL, for the default schema, in one file. It applies the
// same rules to the schema name as Migrate and NewRunner, and renders
// nothing for a name they refuse.
func Migrations(opts *MigrateOpts) ([]Migration, error) {
	schema := opts.schema()
	if err := checkSchemaName("MigrateOpts.Schema", schema); err != nil {
		return nil, fmt.Errorf("atomicphase: %w", err)
	}
	byVersion := map[int]*Migration{}
	entries, _ := fs.ReadDir(migrationFS, "migration")
	for _, e := range entries {
		name := e.Name()
		base, dir, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		num, rest, ok2 := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || !ok2 || err != nil {
			panic("atomicphase: malformed migration file name " + name)
		}
		body, _ := migrationFS.ReadFile(path.Join("migration", name))
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: rest}
			byVersion[v] = m
		}
		if dir == "up" {
			m.Up = keystore.Render(string(body), schema)
			if c := contractMark.FindStringSubmatch(m.Up); c != nil {
				m.Contract = true
				m.Needs, _ = strconv.Atoi(c[1])
			}
		} else {
			m.Down = keystore.Render(string(body), schema)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Beginner is what Migrate needs from a database handle: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx all satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrateLockID is the advisory lock that serialises concurrent Migrate
// calls across processes ("atomicph" in ASCII).
const migrateLockID = 0x61746f6d69637068

// Migrate applies the migrations the database does not have yet, each in
// its own transaction, recording them in atomicphase_migration: the
// expand steps, which a running previous release keeps working on, and
// the contract steps (Migration.Contract) only with MigrateOpts.Contract
// or on a database it migrates from nothing (no ledger, no key table), so
// that a service may call it at start-up during a rollout. A contract step
// refuses, changing nothing, while a process of an older release may
// still run (ErrOlderReleaseLive; the expand steps before it are
// applied). It is idempotent and safe to call from several processes at once: an advisory
// lock makes them take turns, and each re-reads what is applied after
// taking it. It returns the versions it applied. opts may be nil for the
// defaults; with opts.Citus it then distributes the key table and its
// functions on a Citus coordinator. A migration that builds indexes
// concurrently runs outside a transaction (see migrate_online.go), and
// needs db to be a *pgxpool.Pool or a *pgx.Conn (given a pgx.Tx, Migrate
// applies the migrations before it in that transaction and stops there).
func Migrate(ctx context.Context, db Beginner, opts *MigrateOpts) ([]int, error) {
	migrations, err := Migrations(opts)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.Citus {
		if err := checkCitus(ctx, db); err != nil {
			return nil, err
		}
	}
	if opts == nil || !opts.AllowPublicCreate {
		if q, ok := db.(keystore.DB); ok {
			if err := checkSchemasClosed(ctx, q, opts.schema(), "MigrateOpts.AllowPublicCreate, for a database no untrusted role connects to"); err != nil {
				return nil, err
			}
		}
	}
	if opts != nil && opts.LiveWithin < 0 {
		return nil, fmt.Errorf("atomicphase: MigrateOpts.LiveWithin is %s; use a positive duration, or 0 for the default %s", opts.LiveWithin, DefaultVersionHorizon)
	}
	if opts != nil && opts.TargetVersion != 0 {
		if opts.TargetVersion < 0 || opts.TargetVersion > migrations[len(migrations)-1].Version {
			return nil, fmt.Errorf("atomicphase: MigrateOpts.TargetVersion is %d; want a migration's version, 1 to %d, or 0 for all",
				opts.TargetVersion, migrations[len(migrations)-1].Version)
		}
		if m := migrations[slices.IndexFunc(migrations, func(m Migration) bool { return m.Version >= opts.TargetVersion })]; m.Version == opts.TargetVersion && m.Contract && !opts.Contract {
			return nil, fmt.Errorf("atomicphase: MigrateOpts.TargetVersion is %d, migration %03d_%s, a contract step: set MigrateOpts.Contract to apply it", m.Version, m.Version, m.Name)
		}
		migrations = slices.DeleteFunc(migrations, func(m Migration) bool { return m.Version > opts.TargetVersion })
	}
	if opts != nil && opts.ScopeCap {
		// Before the migrations, on a key table that exists: the cap's
		// count must not lose its index while a migration drops the one
		// an older release built.
		var exists bool
		if q, ok := db.(keystore.DB); ok {
			if exists, err = keystore.TableExists(ctx, q, opts.schema()); err != nil {
				return nil, err
			}
		}
		if exists {
			if err := buildScopeCapIndex(ctx, db, opts.schema()); err != nil {
				return nil, fmt.Errorf("atomicphase: build the scope cap's index: %w", err)
			}
		}
	}
	applied, err := applyAll(ctx, db, opts, migrations)
	if err != nil && !errors.Is(err, ErrOlderReleaseLive) {
		return applied, err
	}
	// A contract step refused: the expand steps applied before it are
	// distributed all the same.
	refused := err
	if opts != nil && opts.Citus {
		if err := keystore.DistributeOnCitus(ctx, db, opts.schema()); err != nil {
			return applied, fmt.Errorf("atomicphase: distribute on Citus: %w", err)
		}
	}
	if refused != nil {
		return applied, refused
	}
	if opts != nil && opts.ScopeCap {
		if err := buildScopeCapIndex(ctx, db, opts.schema()); err != nil {
			return applied, fmt.Errorf("atomicphase: build the scope cap's index: %w", err)
		}
	}
	return applied, nil
}

// buildScopeCapIndex builds the index MigrateOpts.ScopeCap asks for, under
// the migration lock, dropping a build an interrupted run left invalid.
func buildScopeCapIndex(ctx context.Context, db Beginner, schema string) error {
	conn, release, err := sessionConn(ctx, db)
	if err != nil && !errors.Is(err, errNoSession) {
		return err
	}
	if err != nil {
		return fmt.Errorf("it is built concurrently, which PostgreSQL cannot do inside a transaction: "+
			"pass Migrate a *pgxpool.Pool or a *pgx.Conn, not a %T", db)
	}
	defer release()
	unlock, err := lockSession(ctx, conn)
	if err != nil {
		return err
	}
	defer unlock()
	// Built once: on Citus, CREATE INDEX CONCURRENTLY IF NOT EXISTS on an
	// index that exists leaves the coordinator's index marked invalid.
	if missing, err := keystore.New(schema, 0).MissingScopeCapIndex(ctx, conn); err != nil || !missing {
		return err
	}
	stmt := keystore.ScopeCapIndexSQL(schema)
	if err := dropInvalidIndex(ctx, conn, schema, stmt); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, stmt)
	return err
}

// applyAll applies the migrations the ledger in schema lacks, in order,
// and returns the versions it applied. On a pool or a connection it holds
// the migration lock for its session, taken without waiting inside a
// statement (see lockSession); on a transaction it takes the lock for each
// migration's transaction (a savepoint of the caller's).
func applyAll(ctx context.Context, db Beginner, opts *MigrateOpts, migrations []Migration) ([]int, error) {
	schema := opts.schema()
	var applied []int
	conn, release, err := sessionConn(ctx, db)
	switch {
	case err == nil:
		defer release()
		unlock, err := lockSession(ctx, conn)
		if err != nil {
			return nil, fmt.Errorf("atomicphase: take the migration lock: %w", err)
		}
		defer unlock()
		db = conn
	case !errors.Is(err, errNoSession):
		return nil, err
	}
	// A database with no migration applied and no key table has no older
	// release on it: its contract steps are applied with the rest. Told
	// under the lock.
	fresh, err := ledgerEmpty(ctx, db, schema)
	if err != nil {
		return nil, fmt.Errorf("atomicphase: read the migration ledger: %w", err)
	}
	if q, ok := db.(keystore.DB); ok && fresh {
		exists, err := keystore.TableExists(ctx, q, schema)
		if err != nil {
			return nil, err
		}
		fresh = !exists
	}
	contract := fresh || (opts != nil && opts.Contract)
	for _, m := range migrations {
		if m.Contract && !fresh {
			if !contract {
				continue // left for a run that asks (PendingMigrations lists it)
			}
			if err := checkNoOlderRelease(ctx, db, opts, m); err != nil {
				return applied, fmt.Errorf("atomicphase: migration %03d_%s: %w", m.Version, m.Name, err)
			}
		}
		done, err := applyMigration(ctx, db, schema, m, conn != nil)
		if err != nil {
			return applied, fmt.Errorf("atomicphase: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if done {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

// applyMigration applies m in a transaction of its own unless the ledger in
// schema says it is applied, and reports whether it applied it; locked says
// the caller holds the migration lock for the session, else it is taken
// for the transaction. A migration marked to run outside a transaction
// goes to applyOnline, which needs the session.
func applyMigration(ctx context.Context, db Beginner, schema string, m Migration, locked bool) (bool, error) {
	if online(m) {
		conn, ok := db.(*pgx.Conn)
		if !ok || !locked {
			return false, fmt.Errorf("it builds indexes concurrently, which PostgreSQL cannot do inside a transaction: "+
				"pass Migrate a *pgxpool.Pool or a *pgx.Conn, not a %T", db)
		}
		return applyOnline(ctx, conn, schema, m)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if !locked {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
			return false, err
		}
	}
	if done, err := inLedger(ctx, tx, schema, m); done || err != nil {
		return false, err
	}
	// On Citus, DDL on a distributed table (ALTER TABLE ... ADD COLUMN)
	// runs over its shards in parallel by default, after which Citus
	// refuses any function command in the same transaction ("cannot run
	// function command because there was a parallel operation"), and a
	// migration that adds a column and a function was refused on a key
	// table already distributed: every upgrade of a Citus cluster. One
	// connection per worker, in order, has no such limit.
	if _, err := tx.Exec(ctx, citusSequentialSQL); err != nil {
		return false, err
	}
	// One statement at a time: Citus forwards some DDL on a distributed
	// table (ALTER TABLE, CREATE INDEX) to the workers as the text the
	// client sent, which the workers refuse when it holds several.
	for _, stmt := range splitStatements(m.Up) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	if err := record(ctx, tx, schema, m); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// citusSequentialSQL makes the migration's multi-shard commands run over
// one connection per worker, in order, where Citus is installed; elsewhere
// it does nothing.
const citusSequentialSQL = `DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    END IF;
END $$`

// execQuerier runs statements: a transaction or a connection.
type execQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// inLedger makes the schema and the migration ledger if need be, and
// reports whether the ledger has m.
func inLedger(ctx context.Context, q execQuerier, schema string, m Migration) (bool, error) {
	if schema != "" {
		if _, err := q.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return false, err
		}
	}
	if _, err := q.Exec(ctx, keystore.Render(`CREATE TABLE IF NOT EXISTS /* TEMPLATE: schema */atomicphase_migration (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`, schema)); err != nil {
		return false, err
	}
	var exists bool
	err := q.QueryRow(ctx, keystore.Render("SELECT EXISTS (SELECT FROM /* TEMPLATE: schema */atomicphase_migration WHERE version = $1)", schema), m.Version).Scan(&exists)
	return exists, err
}

// record adds m to the ledger.
func record(ctx context.Context, q execQuerier, schema string, m Migration) error {
	_, err := q.Exec(ctx, keystore.Render("INSERT INTO /* TEMPLATE: schema */atomicphase_migration (version, name) VALUES ($1, $2)", schema), m.Version, m.Name)
	return err
}

// splitStatements splits a migration's SQL into its statements, at the
// semicolons outside comments, quoted strings and identifiers, and
// dollar-quoted bodies. Comments stay with the statement they precede; a
// trailing piece with nothing but comments and space is dropped.
func splitStatements(sql string) []string {
	var out []string
	start := 0
	code := false // the current piece has more than comments and space
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(sql)
			}
			continue
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			if j := strings.Index(sql[i+2:], "*/"); j >= 0 {
				i += j + 4
			} else {
				i = len(sql)
			}
			continue
		case c == '\'' || c == '"':
			code = true
			for i++; i < len(sql); i++ {
				if sql[i] == c {
					if i+1 < len(sql) && sql[i+1] == c { // a doubled quote
						i++
						continue
					}
					break
				}
			}
		case c == '$':
			if tag := dollarTag(sql[i:]); tag != "" {
				code = true
				if j := strings.Index(sql[i+len(tag):], tag); j >= 0 {
					i += len(tag) + j + len(tag)
				} else {
					i = len(sql)
				}
				continue
			}
			code = true
		case c == ';':
			if code {
				out = append(out, strings.TrimSpace(sql[start:i+1]))
			}
			start, code = i+1, false
		case c != ' ' && c != '\t' && c != '\n' && c != '\r':
			code = true
		}
		i++
	}
	if code {
		out = append(out, strings.TrimSpace(sql[start:]))
	}
	return out
}

// dollarTag returns the dollar-quote opening s, such as $$ or $body$, or
// "" when s does not start with one.
func dollarTag(s string) string {
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '$':
			return s[:i+1]
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 1 && c >= '0' && c <= '9':
		default:
			return ""
		}
	}
	return ""
}

// CheckSchema reports whether the database has the key table and functions
// this version of the library needs, in Config.Schema, and whether the
// pool's query exec mode works on the way to it. Call it at start-up: it
// returns nil when all is well, an error wrapping ErrSchemaMissing that
// names what is missing and says to run Migrate, an error wrapping
// ErrExecModeUnsafe that says which exec mode to use when a pooler
// (PgBouncer in transaction pooling mode) stands in front of the server and
// the pool's mode keeps prepared statements between transactions, last an
// error wrapping
// ErrSchemaOpen when every role may create objects in the key table's
// schema or on the pool's search_path (which a caller that migrated with
// MigrateOpts.AllowPublicCreate may accept), and a store error when the
// database cannot be asked. It reads the catalog and writes nothing.
func (r *Runner) CheckSchema(ctx context.Context) error {
	missing, err := r.store.Missing(ctx, r.pool)
	if err != nil {
		return storeError("check schema", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s; run atomicphase.Migrate (or apply schema.sql)%s",
			ErrSchemaMissing, strings.Join(missing, ", "), schemaHint(r.cfg.Schema))
	}
	if r.cfg.MaxUnfinishedPerScope > 0 {
		noIndex, err := r.store.MissingScopeCapIndex(ctx, r.pool)
		if err != nil {
			return storeError("check schema", err)
		}
		if noIndex {
			return fmt.Errorf("%w: missing %s, which Config.MaxUnfinishedPerScope counts with; "+
				"run atomicphase.Migrate with MigrateOpts.ScopeCap (atomicphase migrate --scope-cap)%s",
				ErrSchemaMissing, keystore.ScopeCapIndex, schemaHint(r.cfg.Schema))
		}
	}
	if err := r.checkExecMode(ctx); err != nil {
		return err
	}
	// Last, so that a caller who knows no untrusted role connects (and
	// migrated with MigrateOpts.AllowPublicCreate) may accept it.
	return checkSchemasClosed(ctx, r.pool, r.cfg.Schema, "MigrateOpts.AllowPublicCreate and accept this error, for a database no untrusted role connects to")
}

// ErrSchemaOpen is wrapped by the error of Migrate and CheckSchema for a
// database where every role may create objects in the key table's schema
// or in a schema on the connection's search_path (MigrateOpts.AllowPublicCreate).
var ErrSchemaOpen = errors.New("atomicphase: every role may create objects where the library's statements look for them")

// plainIdentifier matches a name SQL takes without quotes.
var plainIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// checkSchemasClosed returns an error wrapping ErrSchemaOpen, naming the
// schemas and the fix (and optOut, the setting that allows it), when every
// role may create objects in schema or on db's search_path.
func checkSchemasClosed(ctx context.Context, db keystore.DB, schema, optOut string) error {
	open, err := keystore.OpenSchemas(ctx, db, schema)
	if err != nil {
		return storeError("check who may create objects in the schema", err)
	}
	if len(open) == 0 {
		return nil
	}
	var revokes []string
	for _, s := range open {
		name := s
		if !plainIdentifier.MatchString(s) {
			name = pgx.Identifier{s}.Sanitize()
		}
		revokes = append(revokes, "REVOKE CREATE ON SCHEMA "+name+" FROM PUBLIC")
	}
	return fmt.Errorf("%w: schema %s (PostgreSQL 14 and earlier grant it on public): any role could then define a function or "+
		"an operator that the library's statements call in place of the built-in one, and run its code as the role that sends them; "+
		"run %s (or set %s)",
		ErrSchemaOpen, strings.Join(open, ", "), strings.Join(revokes, "; "), optOut)
}

// ErrGrantsMissing is wrapped by CheckGrants' error for a role that lacks
// a privilege a Runner needs on the library's tables.
var ErrGrantsMissing = errors.New("atomicphase: the role lacks privileges the Runner needs")

// CheckGrants reports whether the role the Runner's pool connects as has
// every privilege requests, the sweep, the reapers and the operators'
// actions need on the library's tables (docs/security-and-limits.md,
// "Database roles"): nil when it has, an error wrapping ErrGrantsMissing
// that names each one missing, and a store error when the database cannot
// be asked. Call it at start-up with CheckSchema, in a process that runs
// requests: a role without them fails a request only when something goes
// wrong (a failed attempt's history cannot be written, and its key stays
// held until its lease ends). A read-only console's role needs none of
// it. It reads the catalog and writes nothing.
func (r *Runner) CheckGrants(ctx context.Context) error {
	missing, err := keystore.MissingGrants(ctx, r.pool, r.cfg.Schema)
	if err != nil {
		return storeError("check grants", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s; grant them as docs/security-and-limits.md (\"Database roles\") gives the runtime role's",
			ErrGrantsMissing, strings.Join(missing, ", "))
	}
	return nil
}

func schemaHint(schema string) string {
	if schema == "" {
		return " on the connection's search_path"
	}
	return fmt.Sprintf(" with MigrateOpts.Schema %q", schema)
}
