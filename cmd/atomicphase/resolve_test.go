package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// As if their calls' outcomes were unknown (the fixture's phases have
	// no reconcile function, for which resolve is refused).
	b.exec(t, `UPDATE idempotency_keys SET unknown_at = now(), status = CASE WHEN status = 'w' THEN 'u' ELSE status END WHERE idempotency_key IN ('abandoned-1', 'parked-1')`)
	res := b.run(t, "resolve", "bob", "abandoned-1", "--not-happened", "--note", "no such transfer at the bank (ops: ana)", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "verdict recorded (did not happen: the call will be made)")
	k := b.inspect(t, "bob", "abandoned-1")
	require.NotNil(t, k.ResolvedHappened)
	require.False(t, *k.ResolvedHappened)
	require.Equal(t, "no such transfer at the bank (ops: ana)", *k.ResolvedNote)
	require.NotNil(t, k.ResolvedAt)
	requireDueNow(t, k.NextAttemptAt)

	res = b.run(t, "inspect", "bob", "abandoned-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "did not happen at")
	require.Contains(t, res.stdout, "no such transfer at the bank (ops: ana)")

	res = b.run(t, "resolve", "bob", "parked-1", "--happened", "--note", "seen in the portal", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "happened: the request goes on")
	require.Contains(t, res.stdout, "the key stays parked, as it was parked for good")
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt, "a key parked for good (its account closed) stays parked")
	require.Nil(t, b.inspect(t, "bob", "parked-1").ResolvedResult)

	res = b.run(t, "resolve", "bob", "parked-1", "--happened", "--result", `{"label_id":"lbl_9x2"}`, "--note", "carrier portal", "--yes")
	require.Equal(t, 0, res.code, res.stderr)
	require.JSONEq(t, `{"label_id":"lbl_9x2"}`, string(b.inspect(t, "bob", "parked-1").ResolvedResult))
}

func TestResolveRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"resolve", "bob", "abandoned-1", "--note", "x"}, exitUsage, "exactly one of --happened and --not-happened"},
		{[]string{"resolve", "bob", "abandoned-1", "--happened", "--not-happened", "--note", "x"}, exitUsage, "exactly one of"},
		{[]string{"resolve", "bob", "abandoned-1", "--happened"}, exitUsage, "--note is required"},
		{[]string{"resolve", "bob", "abandoned-1", "--not-happened", "--result", `"x"`, "--note", "x"}, exitUsage, "--result goes with --happened"},
		{[]string{"resolve", "bob", "abandoned-1", "--happened", "--result", "lbl_9x2", "--note", "x"}, exitUsage, "is not JSON"},
		{[]string{"resolve", "alice", "finished-1", "--happened", "--note", "x"}, exitFailure, "is finished: there is nothing left to resolve"},
		{[]string{"resolve", "alice", "missing", "--happened", "--note", "x"}, exitFailure, `no key "missing" in scope "alice"`},
		// Before, accepted, printing "the request goes on without making
		// the call again", and the call was made all the same.
		{[]string{"resolve", "bob", "abandoned-1", "--happened", "--note", "x"}, exitFailure,
			`waits on no call of unknown outcome (its phase has no reconcile function, or the call is known not to have been made), so there is no verdict to record: run "atomicphase unpark bob abandoned-1" to retry it`},
		{[]string{"resolve", "bob", "parked-1", "--happened", "--note", "x"}, exitFailure, `run "atomicphase unpark bob parked-1"`},
	} {
		res := b.run(t, tc.args...)
		require.Equal(t, tc.code, res.code, "%v: %s", tc.args, res.stderr)
		require.Contains(t, res.stderr, tc.want, tc.args)
	}
	require.Nil(t, b.inspect(t, "bob", "abandoned-1").ResolvedHappened, "nothing recorded")
	require.Nil(t, b.inspect(t, "bob", "parked-1").ResolvedHappened, "nothing recorded")
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt, "left parked")
}

// resolve asks before it records a verdict, as forget does: a verdict of
// happened means a call is never made again, not happened that it is made.
func TestResolveAsksFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `UPDATE idempotency_keys SET unknown_at = now(), status = CASE WHEN status = 'w' THEN 'u' ELSE status END WHERE idempotency_key = 'abandoned-1'`)
	res := b.runInput(t, "n\n", "resolve", "bob", "abandoned-1", "--happened", "--note", "portal")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, "it will not be made again? [y/N]")
	require.Contains(t, res.stderr, "not confirmed: nothing recorded")
	require.Nil(t, b.inspect(t, "bob", "abandoned-1").ResolvedHappened, "nothing recorded")
	res = b.runInput(t, "y\n", "resolve", "bob", "abandoned-1", "--happened", "--note", "portal")
	require.Equal(t, 0, res.code, res.stderr)
	require.NotNil(t, b.inspect(t, "bob", "abandoned-1").ResolvedHappened)
}
