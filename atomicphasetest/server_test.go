package atomicphasetest

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

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
