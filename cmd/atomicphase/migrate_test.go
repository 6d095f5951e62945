package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, &atomicphasetest.Options{SkipMigrations: true})
	migrations, err := atomicphase.Migrations(nil)
	require.NoError(t, err)
	latest := migrations[len(migrations)-1]

	res := b.run(t, "keys")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, "run `atomicphase migrate`")

	res = b.run(t, "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	want := ""
	for _, m := range migrations {
		want += "applied " + fmt.Sprintf("%03d", m.Version) + "_" + m.Name + "\n"
	}
	want += "schema at version " + fmt.Sprintf("%03d", latest.Version) + "\n"
	require.Equal(t, want, res.stdout)
	require.NoError(t, b.runner.CheckSchema(b.ctx))

	res = b.run(t, "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "up to date (version "+fmt.Sprintf("%03d", latest.Version)+")\n", res.stdout)

	res = b.run(t, "keys")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "no keys match\n", res.stdout)
}

// TestMigrateLeavesTheContractStep: on a database that has migrations,
// migrate applies the expand steps and names the contract step it left;
// --contract refuses it while an older release was seen within
// --live-within, and applies it once none was.
func TestMigrateLeavesTheContractStep(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, &atomicphasetest.Options{SkipMigrations: true})
	res := b.run(t, "migrate", "--to", "15")
	require.Equal(t, 0, res.code, res.stderr)
	// A process of 0.2.0 announces a version (it sets seen_at alone).
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO atomicphase_workflow_versions (workflow, version, shape, phases) VALUES ('w', 'v', 's', '{a}')`)
	require.NoError(t, err)

	res = b.run(t, "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "applied 016_sweep_watermark\napplied 017_key_state\napplied 018_hot_finish\napplied 019_record_first\n"+
		"schema at version 019\n"+
		"contract step 020_drop_request_indexes left for migrate --contract, once no process of a release that needs a migration before 019 is left\n", res.stdout)

	res = b.run(t, "migrate", "--contract")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, "a process of an older release may still be running")
	require.Contains(t, res.stderr, "within MigrateOpts.LiveWithin (24h0m0s)")

	_, err = b.db.Pool.Exec(b.ctx, `UPDATE atomicphase_workflow_versions SET seen_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	res = b.run(t, "migrate", "--contract", "--live-within", "30m")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "applied 020_drop_request_indexes\nschema at version 020\n", res.stdout)
}

// TestMigrateSchema migrates into a schema of its own: the commands find
// the keys there with --schema and say to migrate without it.
func TestMigrateSchema(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, &atomicphasetest.Options{SkipMigrations: true})

	res := b.run(t, "--schema", "ops", "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "applied 001_")

	r, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: "ops"})
	require.NoError(t, err)
	require.NoError(t, r.CheckSchema(b.ctx))

	res = b.run(t, "--schema", "ops", "keys", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	require.Empty(t, res.stdout)

	res = b.run(t, "keys")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, "no atomicphase schema on the connection's search_path")

	res = b.run(t, "--schema", "elsewhere", "keys")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `no atomicphase schema in schema "elsewhere"`)

	res = b.run(t, "--schema", "pg_nope", "keys")
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, "--schema or --lock-timeout")
}

// TestMigrateCitus: --citus distributes on a Citus coordinator (the
// library's Citus test mode covers that); on plain PostgreSQL it applies
// nothing and says why.
func TestMigrateCitus(t *testing.T) {
	t.Parallel()
	if atomicphasetest.OnCitus() {
		t.Skip("needs a database without the citus extension: the Citus test mode creates it in every one")
	}
	b := setupEmpty(t, &atomicphasetest.Options{SkipMigrations: true})
	res := b.run(t, "migrate", "--citus")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, "no citus extension")
	require.Empty(t, res.stdout, "nothing was applied")
}
