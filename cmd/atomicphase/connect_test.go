package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestDatabaseURL(t *testing.T) {
	t.Parallel()

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, "", "keys")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "no database given: set DATABASE_URL")
		require.Empty(t, res.stdout)
	})

	t.Run("FromEnvironment", func(t *testing.T) {
		t.Parallel()
		b := setupEmpty(t, nil)
		res := runCLI(t, map[string]string{"DATABASE_URL": b.db.URL}, "", "keys")
		require.Equal(t, 0, res.code, res.stderr)
		require.Equal(t, "no keys match\n", res.stdout)
	})

	// The URL can come from a file, so the password is in neither argv
	// nor the environment.
	t.Run("FromFile", func(t *testing.T) {
		t.Parallel()
		b := setupEmpty(t, nil)
		file := filepath.Join(t.TempDir(), "database-url")
		require.NoError(t, os.WriteFile(file, []byte(b.db.URL+"\n"), 0o600))
		res := runCLI(t, map[string]string{"DATABASE_URL_FILE": file}, "", "keys")
		require.Equal(t, 0, res.code, res.stderr)
		require.Equal(t, "no keys match\n", res.stdout)
	})

	t.Run("FlagOverEnvironment", func(t *testing.T) {
		t.Parallel()
		b := setupEmpty(t, nil)
		res := runCLI(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}, "", "--database-url", b.db.URL, "keys")
		require.Equal(t, 0, res.code, res.stderr)
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, "", "--database-url", "postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=5", "keys")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, `cannot connect to database "none" on 127.0.0.1:1 as "nobody"`)
		require.Contains(t, res.stderr, "check --database-url (or DATABASE_URL)")
		require.NotContains(t, res.stderr, "secret")
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, "", "--database-url", "postgres://a:b@host:notaport/db", "keys")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "not a PostgreSQL URL")
	})

	// A string invalid elsewhere than its password: no form of it may
	// print the password, from the flag or from the environment.
	t.Run("MalformedKeepsThePasswordSecret", func(t *testing.T) {
		t.Parallel()
		for _, url := range []string{
			"host=127.0.0.1 password = S3cretPW port=abc",
			"password =S3cretPW port=abc",
			"postgres://u:S3c@retPW@127.0.0.1:abc/db",
		} {
			res := runCLI(t, nil, "", "--database-url", url, "keys")
			require.Equal(t, exitFailure, res.code)
			require.Contains(t, res.stderr, "invalid port", "the error still says what is wrong")
			res2 := runCLI(t, map[string]string{"DATABASE_URL": url}, "", "keys")
			for _, out := range []string{res.stderr, res.stdout, res2.stderr, res2.stdout} {
				require.NotContains(t, out, "S3c", url)
				require.NotContains(t, out, "retPW", url)
			}
		}
	})
}

// TestUnmigrated runs every command that needs the schema against a
// database without it: each fails and says to run migrate.
func TestUnmigrated(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, &atomicphasetest.Options{SkipMigrations: true})
	for _, args := range [][]string{
		{"keys"}, {"inspect", "s", "k"}, {"resume", "s", "k"}, {"unpark", "s", "k"},
		{"forget", "--yes", "s", "k"}, {"reap", "--older-than", "1h"}, {"sweep", "--once"},
	} {
		res := b.run(t, args...)
		require.Equal(t, exitFailure, res.code, "%v", args)
		require.Contains(t, res.stderr, "the database has no atomicphase schema on the connection's search_path", "%v", args)
		require.Contains(t, res.stderr, "run `atomicphase migrate` with the same --database-url and --schema first", "%v", args)
	}
}
