package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// forget and unpark act on every key a filter selects, after a dry run
// that lists them and changes nothing. Before, cleanup was one forget per
// key.
func TestBulkForgetAndUnpark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "forget", "--workflow", "payout", "--error-contains", lastErrorParked, "--dry-run")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "parked-1")
	require.Contains(t, res.stdout, "dry run: 1 keys would be forgotten; nothing changed")
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt, "a dry run changes nothing")

	res = b.run(t, "unpark", "--workflow", "payout", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "1 keys unparked")
	require.Nil(t, b.inspect(t, "bob", "parked-1").ParkedAt)

	// Finished keys may have paid: a dry run marks them, a forget skips
	// them, and a forced one, with a reason, forgets them.
	res = b.run(t, "forget", "--status", "finished", "--scope", "alice", "--dry-run")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "PAID alice finished-1: it finished after a foreign call that may have paid; it will be skipped")
	res = b.run(t, "forget", "--status", "finished", "--scope", "alice", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "0 keys forgotten")
	res = b.run(t, "forget", "--status", "finished", "--scope", "alice", "--yes", "--force", "--reason", "answers of a fixed bug")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "2 keys forgotten")

	res = b.run(t, "forget", "--workflow", "nothing-here", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "no keys match")
}

func TestBulkRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"forget"}, "takes SCOPE and KEY, or, for every key a filter selects"},
		{[]string{"unpark", "bob", "parked-1", "--workflow", "payout"}, "acts on that key alone"},
		{[]string{"forget", "--status", "abandoned", "--yes"}, "only keys [parked finished] can be acted on"},
		{[]string{"unpark", "--older-than", "-1h"}, "is negative"},
	} {
		res := b.run(t, tc.args...)
		require.NotEqual(t, 0, res.code, tc.args)
		require.Contains(t, res.stderr, tc.want, tc.args)
	}
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt, "nothing changed")
}
