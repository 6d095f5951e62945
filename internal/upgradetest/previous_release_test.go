// Package upgradetest checks that an upgrade needs no stop: the previous
// release's core suite, its code taken from git history, runs against a
// database migrated by this version. Migrations are expand/contract (see
// docs/operations.md, "Upgrades"), so a process of the previous release
// keeps serving while the new one rolls out.
//
// The test runs only when ATOMICPHASE_TEST_PREVIOUS_RELEASE is set (make
// test/previous, which CI runs): it builds another copy of the library and
// runs its suite, which takes a minute.
package upgradetest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// previousRelease is the commit of the previous release (CHANGELOG.md;
// tag v0.3.0): 0.3.0. Move it on at each release.
const previousRelease = "75a6fa5b7a23371dc60cefafd491690ea5623fc2"

// skipped are the previous release's tests that check the schema itself
// or build a database up from an older schema (what Migrate applies, a
// migration at a time, from an upgrade's starting point, what CheckSchema
// finds on an empty database): here every database starts with this
// version's schema, so they would test the setup, not the upgrade.
// TestMigration.* runs the previous release's down migrations, which know
// nothing of what this one's migrations add.
const skipped = `^(TestMigrate.*|TestMigration.*|TestMigrationsGoDownAndUpAgain|TestLaterMigrationsGoDownAndUpAgain|TestCheckSchema.*|` +
	`TestUnmigratedDatabaseIsSchemaMissing|TestSchema.*|TestConfigSchema.*|TestMigrationsRenderTheSchema|ExampleMigrate|` +
	`TestUpgradeCarriesKeysInEveryState|TestKeyHistoryNeedsItsMigration|TestAContractStep.*|TestTheContractStep.*|` +
	`TestTheHistorysMigrationGrantsItToTheKeyTablesWriters|TestNoFunctionRunsAsItsOwner)$`

func TestPreviousReleaseRunsOnThisSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	srv := startPrevious(t, ctx, "to run the previous release's suite on this schema")

	// Every database the previous release's harness creates is a copy of
	// template1: migrated by this version, its ledger says every migration
	// the previous release knows is applied, so its Migrate applies none.
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	u.Path = "/template1"
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	applied, err := atomicphase.Migrate(ctx, pool, nil)
	pool.Close()
	require.NoError(t, err)
	require.NotEmpty(t, applied)

	dir := t.TempDir()
	extractPrevious(t, ctx, dir)

	suite := exec.CommandContext(ctx, "go", "test", "-count=1", "-skip", skipped, ".")
	suite.Dir = dir
	suite.Env = append(withoutEnv(os.Environ(), "TEST_DATABASE_URL", "DATABASE_URL", "ATOMICPHASE_TEST_CITUS_URL", "ATOMICPHASE_TEST_EXEC_MODE"),
		"TEST_DATABASE_URL="+srv.URL)
	out, err := suite.CombinedOutput()
	t.Logf("previous release %s on this schema (migrations %v):\n%s", previousRelease[:7], applied, out)
	require.NoError(t, err, "the previous release's core suite passes on this version's schema")
}

// startPrevious skips the test unless ATOMICPHASE_TEST_PREVIOUS_RELEASE
// is set (make test/previous; why says what the test would do), and
// starts a throwaway PostgreSQL for it.
func startPrevious(t *testing.T, ctx context.Context, why string) *pgtemp.Server {
	t.Helper()
	if os.Getenv("ATOMICPHASE_TEST_PREVIOUS_RELEASE") == "" {
		t.Skip("set ATOMICPHASE_TEST_PREVIOUS_RELEASE=1 (make test/previous) " + why)
	}
	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err, "a throwaway PostgreSQL from local binaries (scripts/ensure-postgres installs them)")
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// extractPrevious writes the previous release's tree, from git history,
// into dir.
func extractPrevious(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q",
		filepath.Join("..", ".."), previousRelease, dir)).CombinedOutput()
	require.NoError(t, err, "extract the previous release (%s) from git history: %s", previousRelease, out)
}

// withoutEnv is env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
