package atomicphasetest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestNewDBIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	a := NewDB(t, nil)
	b := NewDB(t, nil)
	require.NotEqual(t, a.Name, b.Name)
	ctx := context.Background()
	_, err := a.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, status)
		VALUES ('s', 'k', 'w', '\x00', 'POST', '/', '{}', 'w')`)
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
	if OnCitus() {
		require.Equal(t, 2, setups, "on Citus, nothing is cloned: Setup runs for every database")
	} else {
		require.LessOrEqual(t, setups, 1, "the template is built once per process")
	}
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
