package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Everything but binary-1 is two hours old; finished-1 is the only old
	// finished key.
	b.exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours', updated_at = now() - interval '2 hours',
		finished_at = CASE WHEN finished_at IS NULL THEN NULL ELSE now() - interval '2 hours' END
		WHERE idempotency_key <> 'binary-1'`)

	res := b.run(t, "reap", "--older-than", "1h")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "deleted 1 finished keys that finished more than 1h0m0s ago\n", res.stdout)
	require.False(t, b.keyExists(t, "finished-1"))
	for _, key := range []string{"binary-1", "abandoned-1", "parked-1", "running-1", "stale-1"} {
		require.True(t, b.keyExists(t, key), key)
	}

	res = b.run(t, "reap", "--older-than", "1h")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "deleted 0 finished keys that finished more than 1h0m0s ago\n", res.stdout)

	// One key per statement and one statement: the cap is reached.
	res = b.run(t, "reap", "--older-than", "0s", "--batch-size", "1", "--max-batches", "1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "deleted 1 finished keys that finished more than 0s ago\n")
	require.Contains(t, res.stdout, "stopped at the cap of 1 keys")
	require.False(t, b.keyExists(t, "binary-1"))
	for _, key := range []string{"abandoned-1", "parked-1", "running-1", "stale-1"} {
		require.True(t, b.keyExists(t, key), key)
	}
}
