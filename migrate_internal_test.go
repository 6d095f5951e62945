package atomicphase

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The documentation shows the statements CitusDistribution returns.
func TestScaleDocShowsTheDistribution(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "scale.md"))
	require.NoError(t, err)
	stmts, err := CitusDistribution("")
	require.NoError(t, err)
	for _, sql := range stmts {
		require.Contains(t, string(doc), sql+";", "docs/scale.md shows %s", sql)
	}
}

// Migrate runs a migration one statement at a time (Citus forwards some DDL
// to the workers as the text sent, which must hold one statement): the
// split keeps dollar-quoted bodies, strings and comments whole.
func TestSplitStatements(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"SELECT 1;", "-- a comment; with a ';'\nSELECT 'a;''b';", "SELECT $f$ ; $$ ; $f$;", "SELECT \"x;y\"\n-- trailing"},
		splitStatements("SELECT 1; -- a comment; with a ';'\nSELECT 'a;''b'; SELECT $f$ ; $$ ; $f$; SELECT \"x;y\"\n-- trailing\n"))
	require.Equal(t, []string{"SELECT $1::text;", "/* c; */ SELECT 2;"}, splitStatements("SELECT $1::text; /* c; */ SELECT 2;"))
	count := map[string]int{"001 up": 4, "006 up": 5, "006 down": 5}
	ms, err := Migrations(nil)
	require.NoError(t, err)
	for _, m := range ms {
		for dir, sql := range map[string]string{"up": m.Up, "down": m.Down} {
			stmts := splitStatements(sql)
			require.NotEmpty(t, stmts)
			for _, s := range stmts {
				require.Equal(t, 0, strings.Count(s, "$$")%2, "migration %03d %s: a body is kept whole:\n%s", m.Version, dir, s)
				require.Regexp(t, `(?m)^\s*(CREATE|DROP|ALTER|DO|SELECT|UPDATE|INSERT|DELETE|SET|GRANT|REVOKE|COMMENT)\b`, s, "migration %03d %s", m.Version, dir)
			}
			if n, ok := count[fmt.Sprintf("%03d %s", m.Version, dir)]; ok {
				require.Len(t, stmts, n, "migration %03d %s", m.Version, dir)
			}
		}
	}
}

// From 0.1.0 on, upgrades need no stop (docs/operations.md, "Upgrades"): a
// migration after 006 builds its indexes concurrently, outside a
// transaction, so that no write to the key table waits for the build.
func TestLaterMigrationsBuildIndexesOnline(t *testing.T) {
	t.Parallel()
	ms, err := Migrations(nil)
	require.NoError(t, err)
	createIndex := regexp.MustCompile(`(?i)\bCREATE\s+(UNIQUE\s+)?INDEX\b`)
	for _, m := range ms {
		if m.Version <= 6 {
			continue
		}
		for _, stmt := range splitStatements(m.Up) {
			if createIndex.MatchString(stmt) {
				require.Regexp(t, concurrentIndex, stmt, "migration %03d builds its index with CREATE INDEX CONCURRENTLY IF NOT EXISTS", m.Version)
				require.True(t, online(m), "migration %03d builds an index concurrently: it starts with %q", m.Version, noTransaction)
			}
		}
	}
}
