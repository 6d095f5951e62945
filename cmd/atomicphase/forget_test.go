package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestForget(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// The CLI has not the workflow's code: a finished key may have paid,
	// and is forgotten only by force, with a reason.
	res := b.run(t, "forget", "--yes", "alice", "finished-1")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `key "finished-1" in scope "alice" finished after a foreign call that may have paid`)
	require.Contains(t, res.stderr, `--force --reason`)
	require.True(t, b.keyExists(t, "finished-1"))
	res = b.run(t, "forget", "--yes", "alice", "finished-1", "--force", "--reason", "the stored answer came from a fixed bug")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, `forgot finished key "finished-1" in scope "alice"`+"\n", res.stdout)
	require.False(t, b.keyExists(t, "finished-1"))
	trail, err := b.runner.AuditTrail(b.ctx, "alice", "finished-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "the stored answer came from a fixed bug", trail[0].Note)

	res = b.runInput(t, "y\n", "forget", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stderr, `Forget parked key "parked-1" in scope "bob" (workflow "payout", created `)
	require.Contains(t, res.stderr, "[y/N]")
	require.Equal(t, `forgot parked key "parked-1" in scope "bob"`+"\n", res.stdout)
	require.False(t, b.keyExists(t, "parked-1"))

	require.True(t, b.keyExists(t, "binary-1"), "only the named keys go")
}

func TestForgetNotConfirmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, answer := range []string{"", "n\n", "no\n", "maybe\n"} {
		res := b.runInput(t, answer, "forget", "bob", "parked-1")
		require.Equal(t, exitFailure, res.code, "%q", answer)
		require.Contains(t, res.stderr, "not confirmed: nothing deleted (answer y, or pass --yes)")
		require.Empty(t, res.stdout)
		require.True(t, b.keyExists(t, "parked-1"))
	}
}

func TestForgetRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ scope, key, why string }{
		{"bob", "abandoned-1", `key "abandoned-1" in scope "bob" is abandoned, and only finished and parked keys can be forgotten: its phases did part of the work`},
		{"carol", "running-1", `key "running-1" in scope "carol" is in_progress, and only finished and parked keys can be forgotten: an attempt is running its phases now`},
		{"carol", "stale-1", `key "stale-1" in scope "carol" is stale, and only finished and parked keys can be forgotten: its phases did part of the work before its holder stopped`},
	} {
		res := b.runInput(t, "y\n", "forget", "--yes", tc.scope, tc.key)
		require.Equal(t, exitFailure, res.code, tc.key)
		require.Contains(t, res.stderr, tc.why)
		require.Empty(t, res.stdout)
		require.True(t, b.keyExists(t, tc.key), tc.key)
	}

	res := b.run(t, "forget", "--yes", "bob", "missing")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `no key "missing" in scope "bob"`)
}

// A parked key whose call's outcome is unknown is refused, skipped by the
// bulk forget and marked by its dry run; --force with --reason forgets it
// and records who and why.
func TestForgetUnsettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `UPDATE idempotency_keys SET unknown_at = now(), status = CASE WHEN status = 'w' THEN 'u' ELSE status END WHERE idempotency_key = 'parked-1'`)

	res := b.run(t, "forget", "--yes", "bob", "parked-1")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `key "parked-1" in scope "bob" is parked with its call's outcome unknown`)
	require.True(t, b.keyExists(t, "parked-1"))

	res = b.run(t, "forget", "--status", "parked", "--dry-run")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "UNSETTLED bob parked-1")
	res = b.run(t, "forget", "--status", "parked", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "0 keys forgotten")
	require.True(t, b.keyExists(t, "parked-1"))

	res = b.run(t, "forget", "--yes", "--force", "bob", "parked-1")
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, "--force needs --reason")

	res = runCLI(t, map[string]string{"USER": "dana"}, "", "--database-url", b.db.URL, "forget", "--yes", "--force", "--reason", "bank says no payout", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.False(t, b.keyExists(t, "parked-1"))
	trail, err := b.runner.AuditTrail(b.ctx, "bob", "parked-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "bank says no payout", trail[0].Note)
	require.Contains(t, string(trail[0].Detail), `"forced": true`)
	require.NotEmpty(t, trail[0].Actor)
}
