// Package atomicphasetest is atomicphase's test support: a real, migrated
// PostgreSQL database per test, and the fault explorer that runs a workflow
// through every fault point × action and checks its invariants. Fake
// downstreams live beside it, in atomicphasetest/fakestripe. Applications
// test their own workflows with it the way atomicphase tests itself: against
// the real key store, never a mock.
//
// # Databases
//
// The server comes from, in order: TEST_DATABASE_URL or DATABASE_URL if set
// (the role needs CREATEDB); else a throwaway cluster started from local
// PostgreSQL binaries (found on PATH or under /usr/lib/postgresql/*/bin; when
// the process runs as root, the server runs as the postgres OS user); else a
// container started through dockertest when a Docker engine answers; else
// the test fails naming all three options.
//
// ATOMICPHASE_TEST_PG_BIN names the directory of initdb and postgres to
// start the throwaway cluster from, instead of looking on PATH and under
// /usr/lib/postgresql: to run the suite on another major version. The
// repository's scripts/postgres-version MAJOR unpacks one (14 to 18) from
// npm and prints that directory; `make test/versions` runs atomicphase's
// core suite on 14 and 18 that way. It has no effect when a URL is set.
//
// Each NewDB call gets its own database, cloned in milliseconds from a
// template that was migrated once per process. A throwaway cluster lives in
// /dev/shm when there is room, where a clone takes ~20ms instead of ~300ms.
// A throwaway server and its temporary directory are removed when the test
// binary exits, even if it is killed: a watchdog process outlives it just
// long enough to clean up.
//
//	func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }
//
//	func TestCharge(t *testing.T) {
//		db := atomicphasetest.NewDB(t, nil)
//		runner, err := atomicphase.NewRunner(db.Pool, nil)
//		...
//	}
//
// # Query exec modes
//
// ATOMICPHASE_TEST_EXEC_MODE (ExecModeEnv) runs every database's pool in a
// chosen pgx query exec mode: cache_statement (pgx's default),
// cache_describe, describe_exec, exec or simple_protocol. The last three
// are what works behind PgBouncer in transaction pooling mode; `make
// test/execmodes` runs atomicphase's core suite once in each mode but the
// default.
//
//	ATOMICPHASE_TEST_EXEC_MODE=exec go test ./...
//
// # PgBouncer
//
// Options.PgBouncer connects a database's pool through a real PgBouncer in
// transaction pooling mode, started once per process in front of the
// server when the pgbouncer binary is installed (on PATH or in /usr/sbin;
// Debian/Ubuntu: apt-get install pgbouncer): on a free loopback port, a
// wildcard [databases] entry so every per-test database is reachable,
// auth_type any (loopback tests only), four server connections per
// database, its configuration and log in a temporary directory that is
// removed with it, and the same watchdog as the throwaway server. Without
// the binary the test is skipped; SkipWithoutPgBouncer skips a parent test
// once instead of each subtest.
//
// # Citus
//
// CitusURLEnv (ATOMICPHASE_TEST_CITUS_URL) switches every NewDB and Open to
// a Citus coordinator and its registered workers: each database is created
// on every node with the citus extension (nothing is cloned: Citus copies
// no database from a template but template1), the workers registered in
// it, four shards per table, the schema migrated and distributed as the
// repository's docs/scale.md says, Options.Setup run, and the tables
// Options.Distribute names distributed, colocated with the key table. A
// few databases are created ahead while tests run; those of a test process
// that died are dropped by the next one. OnCitus tells a test which mode
// it runs in; SkipOnCitus skips one, naming the Citus limitation. The
// repository's scripts/citus-cluster starts a local coordinator and two
// workers from an installed Citus; `make test/citus` runs the suites there.
//
// # Exploring faults
//
// Explore runs a Scenario once cleanly, recording the fault points every
// attempt of it passes, then once more per attempt × point × action with
// that fault injected on that attempt (through the faultinject package),
// and with the following attempts faulted at the same point, each on a
// clean database, retrying like a client until a final answer and checking
// the invariants after each; Report.Coverage says what it explored and what
// it skipped. ExploreDuplicates sends the same request a second time,
// concurrently, at every point instead. See Scenario, and
// docs/fault-injection.md in the repository.
//
// # Unit-testing a phase
//
// BeginPhase gives a test the real transaction a local phase receives, on
// a test database, to call a phase function with directly; PhaseTx.End
// commits it (its queued writes with it) or rolls it back, as the Runner
// would. RunPhase does both around a LocalFunc.
//
// This package imports testing and a Docker client: use it from tests and
// development tools, never from a server's import path.
package atomicphasetest
