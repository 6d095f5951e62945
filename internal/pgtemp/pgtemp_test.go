package pgtemp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		childServer()
		return
	}
	os.Exit(m.Run())
}

// needBinaries skips a test on a machine without PostgreSQL binaries: the
// harness above this package falls back to Docker there.
func needBinaries(t *testing.T) {
	t.Helper()
	if _, err := findBinaries(); err != nil {
		t.Skip("needs local PostgreSQL binaries:", err)
	}
}

func TestStartServesAndStopRemovesEverything(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	ctx := context.Background()
	srv, err := Start(ctx)
	require.NoError(t, err)
	require.DirExists(t, srv.dir)
	require.NotEmpty(t, srv.Bin)

	conn, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	var user string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_user").Scan(&user))
	require.Equal(t, "postgres", user)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, srv.Stop())
	require.NoDirExists(t, srv.dir)
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = pgx.Connect(cctx, srv.URL)
	require.Error(t, err, "the server is down")
	require.NoError(t, srv.Stop(), "a second Stop does nothing")
	require.NoError(t, (*Server)(nil).Stop())
}

// show reads server settings.
func show(t *testing.T, url string, names ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	got := map[string]string{}
	for _, name := range names {
		var v string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v))
		got[name] = v
	}
	return got
}

func TestStartKeepsTheTestSettings(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	srv, err := Start(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	require.Equal(t, map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
		show(t, srv.URL, "fsync", "synchronous_commit", "full_page_writes"))
}

func TestStartWithDurableSettingsAndExtras(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	srv, err := StartWith(context.Background(), &Options{Durable: true, Settings: []string{"work_mem=5MB", "max_connections=50"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	require.Equal(t, map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
		"work_mem": "5MB", "max_connections": "50"},
		show(t, srv.URL, "fsync", "synchronous_commit", "full_page_writes", "work_mem", "max_connections"),
		"extra settings override the defaults")
	require.DirExists(t, srv.DataDir())
	require.False(t, strings.HasPrefix(srv.DataDir(), "/dev/shm/"), "a durable server's fsyncs reach a disk")
}

func TestStartWithCoresPinsEveryServerProcess(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset here")
	}
	srv, err := StartWith(context.Background(), &Options{Cores: "0"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	// A backend forked for this connection reports its own affinity.
	conn, err := pgx.Connect(context.Background(), srv.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var pid int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^Cpus_allowed_list:\s+0$`, string(status))
}

func TestStartWithRefusesAMalformedSetting(t *testing.T) {
	t.Parallel()
	_, err := StartWith(context.Background(), &Options{Settings: []string{"fsync"}})
	require.ErrorContains(t, err, "not name=value")
}

func TestFindBinariesNamesWhereItLooked(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := findBinaries(); err != nil {
		require.ErrorIs(t, err, ErrNoBinaries)
		require.ErrorContains(t, err, "/usr/lib/postgresql/*/bin")
		return
	}
	// Debian's layout is off PATH and still found.
	dir, err := findBinaries()
	require.NoError(t, err)
	require.True(t, hasBinaries(dir))
}

func TestFindBinariesTakesBinEnvAlone(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(BinEnv, empty)
	_, err := findBinaries()
	require.ErrorIs(t, err, ErrNoBinaries, "no fallback when the directory is named")
	require.ErrorContains(t, err, empty)

	for _, name := range []string{"initdb", "postgres"} {
		require.NoError(t, os.WriteFile(filepath.Join(empty, name), nil, 0o755))
	}
	dir, err := findBinaries()
	require.NoError(t, err)
	require.Equal(t, empty, dir)
}

func TestURLFromEnv(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	require.Empty(t, URLFromEnv())
	t.Setenv("DATABASE_URL", "postgres://app")
	require.Equal(t, "postgres://app", URLFromEnv())
	t.Setenv("TEST_DATABASE_URL", "postgres://test")
	require.Equal(t, "postgres://test", URLFromEnv(), "the test URL wins")
}

const childEnv = "PGTEMP_CHILD"

// childServer is the child of TestKilledProcessLeavesNothingBehind: it
// starts a server, and a PgBouncer in front of it when one is installed,
// reports their URLs and directories, and waits to be killed.
func childServer() {
	srv, err := Start(context.Background())
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	line := srv.URL + " " + srv.dir
	if HaveBouncer() {
		b, err := StartBouncer(context.Background(), srv.URL)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		line += " " + b.URL + " " + b.dir
	}
	fmt.Println(line)
	time.Sleep(time.Minute)
}

func TestBouncerPoolsTransactionsAndStopRemovesEverything(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	if _, err := findBouncer(); err != nil {
		t.Skip("needs pgbouncer (apt-get install pgbouncer):", err)
	}
	ctx := context.Background()
	srv, err := Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	direct, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = direct.Exec(ctx, "CREATE DATABASE other")
	require.NoError(t, err)
	require.NoError(t, direct.Close(ctx))

	b, err := StartBouncer(ctx, srv.URL)
	require.NoError(t, err)
	require.DirExists(t, b.dir)
	cfg, err := pgx.ParseConfig(strings.Replace(b.URL, "/postgres?", "/other?", 1))
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	// More clients than server connections, each in a transaction of its
	// own: PgBouncer hands them the same few backends.
	backends := map[int32]bool{}
	for range 2 * BouncerPoolSize {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var db string
		var pid int32
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_database(), pg_backend_pid()").Scan(&db, &pid))
		require.Equal(t, "other", db, "the wildcard entry passes the database name through")
		backends[pid] = true
	}
	require.LessOrEqual(t, len(backends), BouncerPoolSize)

	require.NoError(t, b.Stop())
	require.NoDirExists(t, b.dir)
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = pgx.ConnectConfig(cctx, cfg)
	require.Error(t, err, "PgBouncer is down")
	require.NoError(t, b.Stop(), "a second Stop does nothing")
}
