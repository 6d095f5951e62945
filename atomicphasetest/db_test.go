package atomicphasetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv("ATOMICPHASETEST_CHILD") == "1" {
		childServer()
		return
	}
	os.Exit(Main(m))
}

func TestNewDBIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	a := NewDB(t, nil)
	b := NewDB(t, nil)
	require.NotEqual(t, a.Name, b.Name)
	ctx := context.Background()
	_, err := a.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state)
		VALUES ('s', 'k', 'w', '\x00', 'POST', '/', '{}')`)
	require.NoError(t, err, "the database is migrated")
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&n))
	require.Zero(t, n, "databases are isolated")
}

func TestNewDBRunsSetupOnceAndDropsOnCleanup(t *testing.T) {
	t.Parallel()
	setups := 0
	opts := &Options{SetupID: "harness-setup-test", Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		setups++
		_, err := pool.Exec(ctx, "CREATE TABLE app_things (id int)")
		return err
	}}
	var name string
	t.Run("inner", func(t *testing.T) {
		db := NewDB(t, opts)
		name = db.Name
		_, err := db.Pool.Exec(context.Background(), "INSERT INTO app_things VALUES (1)")
		require.NoError(t, err)
		other := NewDB(t, opts)
		var n int
		require.NoError(t, other.Pool.QueryRow(context.Background(), "SELECT count(*) FROM app_things").Scan(&n))
		require.Zero(t, n)
	})
	require.LessOrEqual(t, setups, 1, "the template is built once per process")
	_, admin, err := server(context.Background())
	require.NoError(t, err)
	var exists bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	require.False(t, exists, "the database is dropped when its test ends")
}

func TestOptionsSetupNeedsID(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), &Options{Setup: func(context.Context, *pgxpool.Pool) error { return nil }})
	require.ErrorContains(t, err, "SetupID")
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"postgres://u:p@h:5432/postgres?sslmode=disable": "postgres://u:p@h:5432/db1?sslmode=disable",
		"postgresql://h/other":                           "postgresql://h/db1",
		"postgres://h:1":                                 "postgres://h:1/db1",
		"host=h port=5 dbname=x":                         "host=h port=5 dbname=x dbname=db1",
	}
	for in, want := range cases {
		got, err := withDatabase(in, "db1")
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	cfg, err := pgx.ParseConfig("host=h port=5 dbname=x dbname=db1")
	require.NoError(t, err)
	require.Equal(t, "db1", cfg.Database, "the later dbname wins")
}

func TestNoServerErrorNamesAllOptions(t *testing.T) {
	t.Parallel()
	err := noServerError([]string{"local binaries: none", "docker: no engine"})
	for _, want := range []string{"TEST_DATABASE_URL", "DATABASE_URL", "initdb", "Docker", "local binaries: none", "docker: no engine"} {
		require.ErrorContains(t, err, want)
	}
}

func TestRedactHidesPassword(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:***@h/db", redact("postgres://u:secret@h/db"))
	require.Equal(t, "postgres://u@h/db", redact("postgres://u@h/db"))
}

// TestKilledProcessLeavesNothingBehind starts a local server in a child
// process, SIGKILLs the child, and checks the watchdog stops the server and
// removes its directory.
func TestKilledProcessLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	if _, err := findBinaries(); err != nil {
		t.Skip("needs local PostgreSQL binaries:", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOMICPHASETEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	url, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
	require.True(t, ok, line)
	require.DirExists(t, dir)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	require.Eventually(t, func() bool {
		_, statErr := os.Stat(dir)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, connErr := pgx.Connect(ctx, url)
		if connErr == nil {
			_ = conn.Close(ctx)
		}
		return errors.Is(statErr, os.ErrNotExist) && connErr != nil
	}, 20*time.Second, 200*time.Millisecond, "server still up or %s still there", dir)
}

// childServer is the child of TestKilledProcessLeavesNothingBehind: it
// starts a server, reports it, and waits to be killed.
func childServer() {
	srv, err := StartServer(context.Background(), nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(srv.URL, srv.dir)
	time.Sleep(time.Minute)
}
