package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every change the CLI makes is on the key's audit trail, with who made it,
// and the trail of a forgotten key stays.
func TestCLIActionsAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	as := func(actor string, args ...string) result {
		return runCLI(t, map[string]string{"ATOMICPHASE_ACTOR": actor}, "", append([]string{"--database-url", b.db.URL}, args...)...)
	}
	res := as("ana", "unpark", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	// A verdict is for a key waiting on a call of unknown outcome (made so
	// by hand here, which writes no history: only the library's operations
	// do).
	b.exec(t, `UPDATE idempotency_keys SET unknown_at = now(), status = CASE WHEN status = 'w' THEN 'u' ELSE status END WHERE idempotency_key = 'parked-1'`)
	res = as("ben", "resolve", "bob", "parked-1", "--happened", "--result", `"po_7"`, "--note", "bank portal", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	res = b.run(t, "forget", "alice", "finished-1", "--yes", "--force", "--reason", "a fixed bug's answer")
	require.Equal(t, 0, res.code, res.stderr)

	res = b.run(t, "inspect", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `history \(oldest first\):\n  \S+Z  parked      running -> parked  at started  attempt 1  token \d+: phase "payout": account closed: payouts to it are refused\n  \S+Z  unparked    parked -> waiting  at started  attempt 1  token \d+\n  \S+Z  resolved    unknown -> unknown  at started  attempt 1  token \d+\n`, res.stdout)
	require.Regexp(t, `audit trail \(newest first\):\n  \S+Z  ben  resolve: bank portal  \{"result": "po_7", "happened": true\}\n  \S+Z  ana  unpark  \{"status_before": "parked"\}\n`, res.stdout)
	res = b.run(t, "inspect", "bob", "parked-1", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, `"history":[{"id":`)
	require.Contains(t, res.stdout, `"event":"parked","status_before":"running","status":"parked"`)
	require.Contains(t, res.stdout, `"event":"unparked","status_before":"parked","status":"waiting"`)

	trail, err := b.runner.AuditTrail(b.ctx, "alice", "finished-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1, "the trail outlives the forgotten key")
	require.Equal(t, "cli", trail[0].Actor, "no ATOMICPHASE_ACTOR, no login name")
	require.Equal(t, "forget", trail[0].Action)
}
