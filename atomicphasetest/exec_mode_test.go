package atomicphasetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Not parallel: it sets the environment.
func TestExecModeEnvReachesPoolAndURL(t *testing.T) {
	t.Setenv(ExecModeEnv, "simple_protocol")
	db := NewDB(t, nil)
	require.Equal(t, pgx.QueryExecModeSimpleProtocol, db.Pool.Config().ConnConfig.DefaultQueryExecMode)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeSimpleProtocol, cfg.ConnConfig.DefaultQueryExecMode, "a second pool from DB.URL")
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys WHERE scope = $1", "s").Scan(&n))

	t.Setenv(ExecModeEnv, "prepared")
	_, err = Open(context.Background(), nil)
	require.ErrorContains(t, err, ExecModeEnv)
	require.ErrorContains(t, err, "describe_exec")
}

func TestWithExecMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h:5/db":                 "postgres://u@h:5/db?default_query_exec_mode=exec",
		"postgres://u@h:5/db?sslmode=disable": "postgres://u@h:5/db?sslmode=disable&default_query_exec_mode=exec",
		"host=h dbname=db":                    "host=h dbname=db default_query_exec_mode=exec",
	} {
		require.Equal(t, want, withExecMode(in, "exec"))
	}
	require.Equal(t, "host=h", withExecMode("host=h", ""))
}
