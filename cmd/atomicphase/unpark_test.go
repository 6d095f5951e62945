package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestUnpark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt)

	res := b.run(t, "unpark", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, `key unparked: the next sweep of a process that registered workflow "payout" resumes it after recovery point "started"`+"\n", res.stdout)
	info := b.inspect(t, "bob", "parked-1")
	require.Nil(t, info.ParkedAt)
	requireDueNow(t, info.NextAttemptAt)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status)
	require.Equal(t, 1, info.Attempts, "unpark runs nothing")

	// An abandoned key resting in backoff is not parked: refused,
	// unchanged; resume clears its backoff, its attempts as they are.
	before := b.inspect(t, "bob", "abandoned-1")
	require.NotNil(t, before.NextAttemptAt)
	res = b.run(t, "unpark", "bob", "abandoned-1")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `key "abandoned-1" in scope "bob" is not parked (it is abandoned): nothing to unpark`)
	require.Contains(t, res.stderr, "atomicphase resume")
	after := b.inspect(t, "bob", "abandoned-1")
	require.Equal(t, before.NextAttemptAt, after.NextAttemptAt, "nothing changed")
	require.Equal(t, before.Attempts, after.Attempts, "nothing changed")
	res = b.run(t, "resume", "bob", "abandoned-1")
	require.Equal(t, 0, res.code, res.stderr)
	after = b.inspect(t, "bob", "abandoned-1")
	requireDueNow(t, after.NextAttemptAt)
	require.Equal(t, before.Attempts, after.Attempts, "resume keeps the attempts of a key that was not parked")
}

func TestResume(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res := b.run(t, "resume", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, `key scheduled: the next sweep of a process that registered workflow "payout" resumes it after recovery point "started"`+"\n", res.stdout)
	info := b.inspect(t, "bob", "parked-1")
	require.Nil(t, info.ParkedAt)
	requireDueNow(t, info.NextAttemptAt)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status)
	require.Equal(t, 1, info.Attempts, "the CLI runs no phase")

	res = b.run(t, "resume", "carol", "running-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, `key scheduled: the next sweep of a process that registered workflow "ship" resumes it`)
	require.Contains(t, res.stdout, "note: an attempt holds the key right now")
	require.Equal(t, atomicphase.KeyInProgress, b.inspect(t, "carol", "running-1").Status)

	res = b.run(t, "resume", "carol", "stale-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "note: the key's lock is stale; the sweep takes it over")
}

func TestUnparkRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, cmd := range []string{"unpark", "resume"} {
		res := b.run(t, cmd, "alice", "finished-1")
		require.Equal(t, exitFailure, res.code, cmd)
		require.Empty(t, res.stdout)
		require.Contains(t, res.stderr, `key "finished-1" in scope "alice" is finished: its stored response is replayed and nothing is left to resume`)
		require.Contains(t, res.stderr, "atomicphase forget")

		res = b.run(t, cmd, "alice", "missing")
		require.Equal(t, exitFailure, res.code, cmd)
		require.Contains(t, res.stderr, `no key "missing" in scope "alice"`)
	}
}

// requireDueNow checks that a key is due for the sweep at once: its next
// attempt is not in the future.
func requireDueNow(t *testing.T, next *time.Time) {
	t.Helper()
	require.NotNil(t, next, "due: the sweep reads the keys that carry a next attempt")
	require.False(t, next.After(time.Now()), "due at once")
}
