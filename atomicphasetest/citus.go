package atomicphasetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

// CitusURLEnv is the environment variable that switches the harness to
// Citus: a postgres:// URL of a Citus coordinator's database in which the
// workers are registered (citus_add_node), as a role that may create
// databases on every node. Every database NewDB and Open hand out is then
// created afresh on the coordinator and on every worker, with the citus
// extension, the workers registered in it, the atomicphase schema
// migrated and distributed as docs/scale.md says (MigrateOpts.Citus), and
// the tables Options.Distribute names distributed, colocated with the key
// table. Citus copies no database from a template other than template1, so
// nothing is cloned: Options.Setup runs for every database. URLFromEnv's
// variables are ignored while it is set.
const CitusURLEnv = "ATOMICPHASE_TEST_CITUS_URL"

// OnCitus reports whether the harness hands out databases on Citus
// (CitusURLEnv is set).
func OnCitus() bool { return citusURL() != "" }

func citusURL() string { return strings.TrimSpace(os.Getenv(CitusURLEnv)) }

// SkipOnCitus skips the test in the Citus mode, giving why: name the
// Citus limitation that makes the test meaningless there.
func SkipOnCitus(t interface {
	Helper()
	Skip(...any)
}, why string) {
	t.Helper()
	if OnCitus() {
		t.Skip("Citus: " + why)
	}
}

// citusNode is one node of the cluster, as the coordinator registered it.
type citusNode struct {
	host string
	port int
}

// citusCluster is the cluster CitusURLEnv names: the coordinator and its
// workers, each reached through a pool on the database the URL names.
type citusCluster struct {
	url         string
	coordinator citusNode
	// spares holds databases created ahead (see database).
	spareMu    sync.Mutex
	spares     chan string
	stopSpares context.CancelFunc
	sparesDone chan struct{}
	workers    []citusNode
	// admins connect to the URL's database on the coordinator (first) and
	// on each worker, in the order of workers.
	admins []*pgxpool.Pool
}

// connectCitus reads the cluster's nodes from the coordinator's
// pg_dist_node and connects to each.
func connectCitus(ctx context.Context, coordURL string) (*citusCluster, error) {
	if !strings.HasPrefix(coordURL, "postgres://") && !strings.HasPrefix(coordURL, "postgresql://") {
		return nil, fmt.Errorf("atomicphasetest: %s must be a postgres:// URL", CitusURLEnv)
	}
	cfg, err := connstr.Parse(coordURL)
	if err != nil {
		return nil, fmt.Errorf("atomicphasetest: %s: %w", CitusURLEnv, err)
	}
	cfg.MaxConns = 16 // parallel tests create databases at once
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("atomicphasetest: %s: %w", CitusURLEnv, err)
	}
	c := &citusCluster{url: coordURL, admins: []*pgxpool.Pool{admin}}
	fail := func(err error) (*citusCluster, error) {
		c.close()
		return nil, fmt.Errorf("atomicphasetest: %s=%s: %w", CitusURLEnv, connstr.Display(coordURL), err)
	}
	var version string
	if err := admin.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'citus'").Scan(&version); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			err = errors.New("no citus extension in that database (CREATE EXTENSION citus)")
		}
		return fail(err)
	}
	rows, err := admin.Query(ctx, `SELECT nodename, nodeport, groupid = 0 FROM pg_dist_node
		WHERE noderole = 'primary' AND isactive ORDER BY groupid, nodename, nodeport`)
	if err != nil {
		return fail(err)
	}
	type registered struct {
		node        citusNode
		coordinator bool
	}
	nodes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registered, error) {
		var r registered
		return r, row.Scan(&r.node.host, &r.node.port, &r.coordinator)
	})
	if err != nil {
		return fail(err)
	}
	u, err := url.Parse(coordURL)
	if err != nil {
		return fail(err)
	}
	c.coordinator.host = u.Hostname()
	if c.coordinator.port, err = strconv.Atoi(u.Port()); err != nil {
		c.coordinator.port = 5432
	}
	for _, n := range nodes {
		if n.coordinator {
			c.coordinator = n.node
		} else {
			c.workers = append(c.workers, n.node)
		}
	}
	if len(c.workers) == 0 {
		return fail(errors.New("no worker registered in the coordinator (SELECT citus_add_node(host, port) there)"))
	}
	for _, w := range c.workers {
		p, err := newPool(ctx, c.nodeURL(w, ""))
		if err != nil {
			return fail(err)
		}
		c.admins = append(c.admins, p)
		if err := p.Ping(ctx); err != nil {
			return fail(fmt.Errorf("worker %s:%d: %w", w.host, w.port, err))
		}
	}
	c.dropOrphans(ctx)
	return c, nil
}

// nodeURL is the coordinator URL pointed at node and, unless "", database.
func (c *citusCluster) nodeURL(n citusNode, database string) string {
	u, _ := url.Parse(c.url) // parsed once already
	u.Host = net.JoinHostPort(n.host, strconv.Itoa(n.port))
	if database != "" {
		u.Path = "/" + database
	}
	return u.String()
}

func (c *citusCluster) close() {
	c.spareMu.Lock()
	stop, done := c.stopSpares, c.sparesDone
	c.spareMu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	for _, p := range c.admins {
		p.Close()
	}
}

// Creating a database with the citus extension on every node and the
// workers registered takes seconds, the same seconds for every test: a
// goroutine keeps spareDatabases of them ready, created ahead while tests
// run, and a test that finds none creates its own.
const spareDatabases = 2

// database returns the name of a new database on every node, registered
// but not yet migrated: a spare if one is ready, else a new one.
func (c *citusCluster) database(ctx context.Context) (string, error) {
	c.spareMu.Lock()
	if c.spares == nil {
		fillCtx, stop := context.WithCancel(context.Background())
		c.spares, c.stopSpares, c.sparesDone = make(chan string, spareDatabases), stop, make(chan struct{})
		go c.fillSpares(fillCtx)
	}
	spares := c.spares
	c.spareMu.Unlock()
	select {
	case name := <-spares:
		return name, nil
	default:
	}
	name := c.newDatabaseName()
	return name, c.createDatabase(ctx, name)
}

// fillSpares keeps c.spares full until ctx ends, then drops what is left
// in it. A failure is left to the tests, which then create their own and
// report it.
func (c *citusCluster) fillSpares(ctx context.Context) {
	defer close(c.sparesDone)
	defer func() {
		for {
			select {
			case name := <-c.spares:
				c.dropQuietly(name)
			default:
				return
			}
		}
	}()
	for ctx.Err() == nil {
		name := c.newDatabaseName()
		if err := c.createDatabase(ctx, name); err != nil {
			c.dropQuietly(name)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		select {
		case c.spares <- name:
		case <-ctx.Done():
			c.dropQuietly(name)
		}
	}
}

// dropQuietly drops a database nobody was given, within citusDropTimeout.
func (c *citusCluster) dropQuietly(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), citusDropTimeout)
	defer cancel()
	_ = c.dropDatabase(ctx, name)
}

// newDatabaseName names a test database after the process, so that a later
// run can tell the databases of a process that died (see dropOrphans).
func (c *citusCluster) newDatabaseName() string {
	return fmt.Sprintf("%s%d_%s", citusDatabasePrefix, os.Getpid(), randomHex(6))
}

// citusDatabasePrefix starts the name of every database the Citus mode
// creates; the process id and a random suffix follow.
const citusDatabasePrefix = "atomicphase_test_p"

// dropOrphans drops the databases of test processes that died without
// dropping theirs (killed, or stopped at a timeout), when the cluster runs
// on this machine, where a process id can be checked.
func (c *citusCluster) dropOrphans(ctx context.Context) {
	if ip := net.ParseIP(c.coordinator.host); c.coordinator.host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return
	}
	rows, err := c.admins[0].Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", citusDatabasePrefix)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(name, citusDatabasePrefix), "_")
		pid, err := strconv.Atoi(pidText)
		if err != nil || processAlive(pid) {
			continue
		}
		_ = c.dropDatabase(ctx, name)
	}
}

// processAlive reports whether a process with id pid runs on this machine.
func processAlive(pid int) bool {
	if runtime.GOOS == "windows" { // no signal 0 to ask with: assume it runs
		return true
	}
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

// onEveryNode runs f for the coordinator (i 0) and every worker at once,
// and returns their errors joined.
func (c *citusCluster) onEveryNode(f func(i int, admin *pgxpool.Pool) error) error {
	errs := make([]error, len(c.admins))
	var wg sync.WaitGroup
	for i, admin := range c.admins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, admin)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// createDatabase creates database name on every node with the citus
// extension in it, and registers the nodes in the coordinator's.
func (c *citusCluster) createDatabase(ctx context.Context, name string) error {
	ident := pgx.Identifier{name}.Sanitize()
	err := c.onEveryNode(func(i int, admin *pgxpool.Pool) error {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
			return err
		}
		node := c.coordinator
		if i > 0 {
			node = c.workers[i-1]
		}
		conn, err := pgx.Connect(ctx, c.nodeURL(node, name))
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		// As buildTemplate: no role but the owner creates in public.
		_, err = conn.Exec(ctx, "CREATE EXTENSION citus; REVOKE CREATE ON SCHEMA public FROM PUBLIC")
		return err
	})
	if err != nil {
		return err
	}
	// Four shards per table rather than Citus's 32: two on each of two
	// workers still place a test's scopes on both, and a database of four
	// shards a table is quicker to create and cheaper to read across.
	if _, err := c.admins[0].Exec(ctx, "ALTER DATABASE "+ident+" SET citus.shard_count = "+strconv.Itoa(citusShardCount)); err != nil {
		return err
	}
	// Registering a node copies the roles to it (ALTER ROLE on a worker),
	// and two registrations at once, for two tests' databases, fail with
	// "tuple concurrently updated": they take turns, across test processes
	// too, through an advisory lock in the coordinator's database.
	lock, err := c.admins[0].Acquire(ctx)
	if err != nil {
		return err
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock($1)", citusRegisterLock); err != nil {
		return err
	}
	defer lock.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", citusRegisterLock) //nolint:errcheck
	conn, err := pgx.Connect(ctx, c.nodeURL(c.coordinator, name))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT citus_set_coordinator_host($1, $2)", c.coordinator.host, c.coordinator.port); err != nil {
		return err
	}
	for _, w := range c.workers {
		if _, err := conn.Exec(ctx, "SELECT citus_add_node($1, $2)", w.host, w.port); err != nil {
			return err
		}
	}
	return nil
}

// dropDatabase drops database name on every node, the coordinator's first
// (its sessions hold connections to the workers').
func (c *citusCluster) dropDatabase(ctx context.Context, name string) error {
	if err := dropOn(ctx, c.admins[0], name); err != nil {
		return err
	}
	return c.onEveryNode(func(i int, admin *pgxpool.Pool) error {
		if i == 0 {
			return nil
		}
		return dropOn(ctx, admin, name)
	})
}

// openCitus is Open in the Citus mode: a database of the test's own on
// every node, set up as CitusURLEnv says. connectURL is the coordinator's,
// or PgBouncer's in front of it.
func openCitus(ctx context.Context, c *citusCluster, opts *Options, connectURL, mode string) (*DB, error) {
	name, err := c.database(ctx)
	db := &DB{Name: name, citus: c}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("atomicphasetest: create database %s on Citus: %w", name, err), db.Close())
	}
	if err := setUpCitus(ctx, c.nodeURL(c.coordinator, name), opts); err != nil {
		return nil, errors.Join(fmt.Errorf("atomicphasetest: set up database %s on Citus: %w", name, err), db.Close())
	}
	return db, db.connect(ctx, connectURL, mode, opts)
}

// setUpCitus migrates and distributes a new database, then runs
// opts.Setup and distributes the tables opts.Distribute names.
func setUpCitus(ctx context.Context, dbURL string, opts *Options) error {
	pool, err := newPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !opts.SkipMigrations {
		if _, err := atomicphase.Migrate(ctx, pool, &atomicphase.MigrateOpts{Citus: true}); err != nil {
			return err
		}
	}
	if opts.Setup != nil {
		if err := opts.Setup(ctx, pool); err != nil {
			return err
		}
	}
	tables := make([]string, 0, len(opts.Distribute))
	for table := range opts.Distribute {
		tables = append(tables, table)
	}
	slices.Sort(tables)
	colocate := keystore.Table
	if opts.SkipMigrations {
		colocate = "default"
	}
	// A table that references another by a foreign key is distributed
	// after it (Citus refuses it before): in passes, each retrying the
	// tables the one before could not distribute, until a pass makes no
	// progress.
	for len(tables) > 0 {
		var left []string
		var firstErr error
		for _, table := range tables {
			if _, err := pool.Exec(ctx, "SELECT create_distributed_table($1, $2, colocate_with := $3)",
				table, opts.Distribute[table], colocate); err != nil {
				left = append(left, table)
				if firstErr == nil {
					firstErr = fmt.Errorf("distribute %s by %s: %w", table, opts.Distribute[table], err)
				}
			}
		}
		if len(left) == len(tables) {
			return firstErr
		}
		tables = left
	}
	return nil
}

// citusRegisterLock serialises node registrations ("atomreg" in ASCII).
const citusRegisterLock = 0x61746f6d726567

// citusShardCount is the shard count of every table a test distributes.
const citusShardCount = 4

// citusDropTimeout bounds dropping a test's database on every node.
const citusDropTimeout = time.Minute
