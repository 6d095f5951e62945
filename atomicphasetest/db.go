package atomicphasetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// Options configure NewDB. A nil *Options means the atomicphase schema only.
type Options struct {
	// Setup adds to the template database after the atomicphase migrations:
	// an application's own schema, say. It runs once per template and test
	// process; every database NewDB hands out is a copy of the result. In
	// the Citus mode (CitusURLEnv) it runs on the coordinator for every
	// database, once the key table is distributed. Defaults to nothing.
	Setup func(ctx context.Context, pool *pgxpool.Pool) error

	// SetupID names what Setup creates; it is part of the template's name,
	// so change it whenever Setup changes. Required when Setup is set.
	SetupID string

	// SkipMigrations hands out databases without the atomicphase schema,
	// for tests of migrations themselves. Defaults to false.
	SkipMigrations bool

	// PoolConfig, if set, adjusts the test pool's configuration before the
	// pool is created (a tracer, a custom dialer, pool sizes). Defaults to
	// nothing.
	PoolConfig func(cfg *pgxpool.Config)

	// PgBouncer connects DB.URL and DB.Pool through a real PgBouncer in
	// transaction pooling mode, started once per process in front of the
	// server (see the package doc). Its pool's query exec mode is exec
	// unless ATOMICPHASE_TEST_EXEC_MODE or PoolConfig says otherwise: pgx's
	// default, cache_statement, prepares statements on a server connection
	// the next transaction may not get. NewDB skips the test when the
	// pgbouncer binary is absent; Open returns an error wrapping
	// ErrNoPgBouncer. Defaults to false.
	PgBouncer bool

	// Distribute names, in the Citus mode (CitusURLEnv), tables Setup
	// created to distribute once it has run, each by the column given,
	// colocated with the key table (so the column is text, like scope; a
	// table's primary key and unique constraints must include it). A
	// phase that writes only its scope's rows of such tables commits on
	// one worker. Tables not named stay local to the coordinator. Ignored
	// on plain PostgreSQL. Defaults to none.
	Distribute map[string]string
}

// ErrNoPgBouncer is wrapped by Open's error when Options.PgBouncer is set
// and no pgbouncer binary is installed.
var ErrNoPgBouncer = pgtemp.ErrNoPgBouncer

// DB is a database of a test's own, dropped when the test ends.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it, for a child process or a second pool.
	URL string
	// Pool is connected to it and closed when the test ends.
	Pool *pgxpool.Pool

	admin *pgxpool.Pool
	citus *citusCluster // set in the Citus mode
}

// shared is the server a test process uses, started on first need, and the
// PgBouncer in front of it if a test asks for one. It is the one piece of
// package state: a test binary runs one server, not one per test.
var shared struct {
	sync.Mutex
	srv       *Server
	admin     *pgxpool.Pool
	templates map[string]bool
	bouncer   *pgtemp.Bouncer
	bounceErr error // why PgBouncer could not be started, not tried again
	citus     *citusCluster
}

// Main runs the tests and then stops the server this package started, if
// any. Call it from TestMain: os.Exit(atomicphasetest.Main(m)). Without it
// the server is still removed, by its watchdog, shortly after exit.
func Main(m *testing.M) int {
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if err := shared.bouncer.Stop(); err != nil {
		fmt.Printf("atomicphasetest: stopping PgBouncer: %v\n", err)
	}
	shared.bouncer, shared.bounceErr = nil, nil
	if shared.citus != nil { // its spare databases are dropped through its admin pool
		shared.citus.close()
		shared.citus, shared.admin = nil, nil
	}
	if shared.admin != nil {
		shared.admin.Close()
		shared.admin = nil
	}
	if err := shared.srv.Stop(); err != nil {
		fmt.Printf("atomicphasetest: stopping PostgreSQL: %v\n", err)
	}
	shared.srv, shared.templates = nil, nil
	return code
}

func server(ctx context.Context) (*Server, *pgxpool.Pool, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil && OnCitus() {
		c, err := connectCitus(ctx, citusURL())
		if err != nil {
			return nil, nil, err
		}
		shared.srv = &Server{URL: c.url, Kind: "citus"}
		shared.admin, shared.citus, shared.templates = c.admins[0], c, map[string]bool{}
	}
	if shared.srv == nil {
		srv := &Server{URL: URLFromEnv(), Kind: "env"}
		if srv.URL == "" {
			started, err := StartServer(ctx, nil)
			if err != nil {
				return nil, nil, err
			}
			srv = started
		}
		admin, err := newPool(ctx, srv.URL)
		if err != nil {
			_ = srv.Stop()
			return nil, nil, fmt.Errorf("atomicphasetest: connect to %s: %w", connstr.Display(srv.URL), err)
		}
		shared.srv, shared.admin, shared.templates = srv, admin, map[string]bool{}
	}
	return shared.srv, shared.admin, nil
}

// bouncer returns the process's PgBouncer in front of srv, starting it on
// first need.
func bouncer(ctx context.Context, srv *Server) (*pgtemp.Bouncer, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.bouncer == nil && shared.bounceErr == nil {
		shared.bouncer, shared.bounceErr = pgtemp.StartBouncer(ctx, srv.URL)
		if shared.bounceErr != nil {
			shared.bounceErr = fmt.Errorf("atomicphasetest: PgBouncer: %w", shared.bounceErr)
		}
	}
	return shared.bouncer, shared.bounceErr
}

const noPgBouncer = "no PgBouncer to test through: install it (apt-get install pgbouncer; scripts/ensure-postgres does)"

// SkipWithoutPgBouncer skips the test, in one line saying how to install
// it, when no pgbouncer binary is installed: call it before subtests that
// each ask for Options.PgBouncer, so they are not skipped one by one.
func SkipWithoutPgBouncer(t testing.TB) {
	t.Helper()
	if !pgtemp.HaveBouncer() {
		t.Skip(noPgBouncer)
	}
}

// NewDB returns a migrated database of the test's own, dropped (with its
// pool closed) when the test ends. It fails the test if no PostgreSQL can be
// had; the message says how to provide one. With Options.PgBouncer and no
// pgbouncer installed, it skips the test instead.
func NewDB(t testing.TB, opts *Options) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := Open(ctx, opts)
	if errors.Is(err, ErrNoPgBouncer) {
		t.Skip(noPgBouncer)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("atomicphasetest: %v", err)
		}
	})
	return db
}

// Open is NewDB for code without a testing.TB (examples, tools): it returns
// a migrated database of its own on the process's server, which the caller
// must Close.
func Open(ctx context.Context, opts *Options) (*DB, error) {
	if opts == nil {
		opts = &Options{}
	}
	if opts.Setup != nil && opts.SetupID == "" {
		return nil, errors.New("atomicphasetest: Options.Setup needs a SetupID naming what it creates")
	}
	mode, err := execModeFromEnv()
	if err != nil {
		return nil, err
	}
	srv, admin, err := server(ctx)
	if err != nil {
		return nil, err
	}
	connectURL := srv.URL
	if opts.PgBouncer {
		b, err := bouncer(ctx, srv)
		if err != nil {
			return nil, err
		}
		connectURL = b.URL
		if mode == "" {
			mode = "exec"
		}
	}
	if c := citusOf(srv); c != nil {
		db, err := openCitus(ctx, c, opts, connectURL, mode)
		if err != nil {
			return nil, err
		}
		return db, nil
	}
	tmpl, err := ensureTemplate(ctx, srv, admin, opts)
	if err != nil {
		return nil, err
	}
	name := "atomicphase_test_" + randomHex(8)
	if err := cloneTemplate(ctx, admin, tmpl, name); err != nil {
		return nil, err
	}
	db := &DB{Name: name, admin: admin}
	if err := db.connect(ctx, connectURL, mode, opts); err != nil {
		return nil, err
	}
	return db, nil
}

// citusOf returns the Citus cluster srv is the coordinator of, nil for a
// plain PostgreSQL.
func citusOf(srv *Server) *citusCluster {
	shared.Lock()
	defer shared.Unlock()
	if srv.Kind != "citus" {
		return nil
	}
	return shared.citus
}

// connect sets db.URL and opens db.Pool on the database, through
// connectURL's server (or PgBouncer). It drops the database if it fails.
func (db *DB) connect(ctx context.Context, connectURL, mode string, opts *Options) error {
	var err error
	if db.URL, err = withDatabase(connectURL, db.Name); err != nil {
		return errors.Join(err, db.Close())
	}
	db.URL = withExecMode(db.URL, mode)
	cfg, err := connstr.Parse(db.URL)
	if err != nil {
		return errors.Join(err, db.Close())
	}
	if opts.PoolConfig != nil {
		opts.PoolConfig(cfg)
	}
	if db.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return errors.Join(err, db.Close())
	}
	return nil
}

// Close closes the pool and drops the database (on every node, on Citus).
func (db *DB) Close() error {
	if db.Pool != nil {
		db.Pool.Close()
	}
	if db.citus != nil {
		ctx, cancel := context.WithTimeout(context.Background(), citusDropTimeout)
		defer cancel()
		if err := db.citus.dropDatabase(ctx, db.Name); err != nil {
			return fmt.Errorf("drop database %s on Citus: %w", db.Name, err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db.Name, err)
	}
	return nil
}

// ensureTemplate creates the migrated template database once. Processes
// sharing a server (go test runs packages in parallel) take turns through
// an advisory lock; a template is marked complete by datistemplate, so one
// left half-built by a killed process is rebuilt.
func ensureTemplate(ctx context.Context, srv *Server, admin *pgxpool.Pool, opts *Options) (string, error) {
	h := sha256.New()
	if !opts.SkipMigrations {
		migrations, err := atomicphase.Migrations(nil)
		if err != nil {
			return "", err
		}
		for _, m := range migrations {
			h.Write([]byte(m.Up))
		}
	}
	h.Write([]byte(opts.SetupID))
	sum := h.Sum(nil)
	name := "atomicphase_tpl_" + hex.EncodeToString(sum[:8])

	shared.Lock()
	done := shared.templates[name]
	shared.Unlock()
	if done {
		return name, nil
	}

	conn, err := admin.Acquire(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Release()
	lockID := int64(binary.BigEndian.Uint64(sum[8:16]))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID) //nolint:errcheck

	var isTemplate *bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&isTemplate)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	if isTemplate == nil || !*isTemplate {
		if err := buildTemplate(ctx, srv, conn.Conn(), name, opts); err != nil {
			return "", fmt.Errorf("atomicphasetest: build template %s: %w", name, err)
		}
	}
	shared.Lock()
	shared.templates[name] = true
	shared.Unlock()
	return name, nil
}

func buildTemplate(ctx context.Context, srv *Server, admin *pgx.Conn, name string, opts *Options) error {
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return err
	}
	url, err := withDatabase(srv.URL, name)
	if err != nil {
		return err
	}
	pool, err := newPool(ctx, url)
	if err != nil {
		return err
	}
	// As PostgreSQL 15 and later are set up: no role but the owner creates
	// objects in public (Migrate refuses a schema every role may create
	// in). It changes nothing on those releases.
	if _, err := pool.Exec(ctx, "REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
		pool.Close()
		return err
	}
	if !opts.SkipMigrations {
		_, err = atomicphase.Migrate(ctx, pool, nil)
	}
	if err == nil && opts.Setup != nil {
		err = opts.Setup(ctx, pool)
	}
	pool.Close()
	if err != nil {
		return err
	}
	_, err = admin.Exec(ctx, "ALTER DATABASE "+ident+" WITH IS_TEMPLATE true")
	return err
}

// cloneTemplate copies the template. CREATE DATABASE fails while another
// session is connected to the template (a parallel process finishing its
// build), so it retries briefly.
func cloneTemplate(ctx context.Context, admin *pgxpool.Pool, tmpl, name string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{tmpl}.Sanitize()
	var err error
	for range 50 {
		if _, err = admin.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), "is being accessed by other users") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newPool is pgxpool.New, whose parse error never quotes url (it may hold a
// password).
func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := connstr.Parse(url)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}
