package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSweepOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `UPDATE idempotency_keys SET finished_at = now() - interval '2 days', created_at = now() - interval '2 days' WHERE idempotency_key = 'finished-1'`)
	before := b.inspect(t, "bob", "abandoned-1")

	res := b.run(t, "sweep", "--once")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "swept once with no workflow registered: no key was resumed (the CLI cannot run phases)\n"+
		"reaped: 1 finished keys that finished more than 24h0m0s ago\n"+
		// abandoned-1 and stale-1; parked and held keys are not waiting.
		"due to be resumed: 1 abandoned or stale keys of workflows the CLI does not know; the next sweep of a process "+
		"that registered their workflow resumes them (list them: atomicphase keys --status abandoned, and --status stale)\n", res.stdout)
	require.False(t, b.keyExists(t, "finished-1"))
	require.True(t, b.keyExists(t, "binary-1"))

	after := b.inspect(t, "bob", "abandoned-1")
	require.Equal(t, before.Attempts, after.Attempts, "the sweep resumed nothing")
	require.Equal(t, before.UpdatedAt, after.UpdatedAt)
	require.Equal(t, "stale", string(b.inspect(t, "carol", "stale-1").Status))
}

func TestSweepOnceJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `UPDATE idempotency_keys SET finished_at = now() - interval '2 hours', created_at = now() - interval '2 hours' WHERE finished_at IS NOT NULL`)

	res := b.run(t, "sweep", "--once", "--json", "--retention", "-1s")
	require.Equal(t, 0, res.code, res.stderr)
	var got sweepJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Equal(t, sweepJSON{UnknownWorkflow: 1}, got, "reaping off; the abandoned key rests in its backoff, the stale one is due")
	require.True(t, b.keyExists(t, "finished-1"))

	res = b.run(t, "sweep", "--once", "--retention", "-1s")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "reaped: none (reaping skipped: --retention is negative)")

	res = b.run(t, "sweep", "--once", "--json", "--retention", "1h")
	require.Equal(t, 0, res.code, res.stderr)
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Equal(t, sweepJSON{Reaped: 2, UnknownWorkflow: 1}, got)
	require.False(t, b.keyExists(t, "finished-1"))
	require.False(t, b.keyExists(t, "binary-1"))
}
