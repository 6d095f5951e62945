package main

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeysTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "keys")
	require.Equal(t, 0, res.code, res.stderr)
	require.Empty(t, res.stderr)

	lines := strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
	require.Len(t, lines, 7)
	require.Regexp(t, `^SCOPE +KEY +WORKFLOW +STATUS +RECOVERY POINT +ATTEMPTS +LAST ERROR +CREATED +UPDATED +PARKED$`, lines[0])
	rows := map[string]string{}
	for _, line := range lines[1:] {
		rows[strings.Fields(line)[1]] = line
	}
	require.Regexp(t, `^alice +finished-1 +checkout +finished +finished +1 +- +\S+Z +\S+Z +-$`, rows["finished-1"])
	require.Regexp(t, `^alice +binary-1 +export +finished +finished +1 +- `, rows["binary-1"])
	// The error is folded onto one line and cut to 40 characters.
	require.Regexp(t, `^bob +abandoned-1 +refund +abandoned +started +1 +phase "refund": downstream 503: the car… +\S+Z +\S+Z +-$`, rows["abandoned-1"])
	require.Regexp(t, `^bob +parked-1 +payout +parked +started +1 +phase "payout": account closed: payouts… +\S+Z +\S+Z +\d{4}-\d\d-\d\dT\S+Z$`, rows["parked-1"])
	require.Regexp(t, `^carol +running-1 +ship +in_progress +started +1 +- `, rows["running-1"])
	require.Regexp(t, `^carol +stale-1 +ship +stale +started +1 +- `, rows["stale-1"])
}

func TestKeysJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := b.keysJSON(t)
	require.Len(t, keys, 6)
	byKey := map[string]keySummary{}
	for _, k := range keys {
		byKey[k.Key] = k
	}

	f := byKey["finished-1"]
	require.Equal(t, "alice", f.Scope)
	require.Equal(t, "checkout", f.Workflow)
	require.Equal(t, "finished", f.Status)
	require.Equal(t, "finished", f.RecoveryPoint)
	require.Equal(t, 1, f.Attempts)
	require.Nil(t, f.LastError)
	require.Nil(t, f.ParkedAt)
	require.NotNil(t, f.FinishedAt)
	require.False(t, f.Locked)

	a := byKey["abandoned-1"]
	require.Equal(t, "abandoned", a.Status)
	require.Equal(t, "started", a.RecoveryPoint)
	require.NotNil(t, a.LastError)
	require.Contains(t, *a.LastError, lastErrorAbandoned) // whole, newline included
	require.NotNil(t, a.NextAttemptAt)
	require.Nil(t, a.ParkedAt)

	p := byKey["parked-1"]
	require.Equal(t, "parked", p.Status)
	require.NotNil(t, p.ParkedAt)
	require.Contains(t, *p.LastError, lastErrorParked)

	require.Equal(t, "in_progress", byKey["running-1"].Status)
	require.True(t, byKey["running-1"].Locked)
	require.Equal(t, "stale", byKey["stale-1"].Status)
	require.True(t, byKey["stale-1"].Locked)

	// Every line carries every member, null when absent.
	first := strings.SplitN(b.run(t, "keys", "--json").stdout, "\n", 2)[0]
	var members map[string]any
	require.NoError(t, json.Unmarshal([]byte(first), &members))
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	sort.Strings(names)
	require.Equal(t, []string{"attempts", "created_at", "finished_at", "key", "last_error", "locked", "next_attempt_at",
		"parked_at", "recovery_point", "scope", "status", "updated_at", "workflow"}, names)
}

func TestKeysFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--status", "in_progress"}, []string{"running-1"}},
		{[]string{"--status", "stale"}, []string{"stale-1"}},
		{[]string{"--status", "abandoned"}, []string{"abandoned-1"}},
		{[]string{"--status", "parked"}, []string{"parked-1"}},
		{[]string{"--status", "finished"}, []string{"binary-1", "finished-1"}},
		{[]string{"--workflow", "ship"}, []string{"running-1", "stale-1"}},
		{[]string{"--scope", "bob"}, []string{"abandoned-1", "parked-1"}},
		{[]string{"--scope", "bob", "--status", "parked"}, []string{"parked-1"}},
		{[]string{"--older-than", "1h"}, nil},
		// The lease is stored on the key row: a lock timeout other than
		// the services' changes no status (it judges only rows an older
		// release locked without storing the lease).
		{[]string{"--lock-timeout", "1ms", "--status", "stale"}, []string{"stale-1"}},
	} {
		require.Equal(t, tc.want, b.keyNames(t, tc.args...), "%v", tc.args)
	}

	b.exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE idempotency_key IN ('parked-1', 'stale-1')`)
	require.Equal(t, []string{"parked-1", "stale-1"}, b.keyNames(t, "--older-than", "1h"))

	res := b.run(t, "keys", "--limit", "2", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	require.Len(t, strings.Split(strings.TrimSpace(res.stdout), "\n"), 2)
	require.Contains(t, res.stderr, "showing the oldest 2 matching keys; raise --limit to see more")

	res = b.run(t, "keys", "--status", "parked", "--workflow", "ship")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "no keys match\n", res.stdout)
}

// keysJSON runs keys --json with args and decodes its lines.
func (b *testBundle) keysJSON(t *testing.T, args ...string) []keySummary {
	t.Helper()
	res := b.run(t, append([]string{"keys", "--json"}, args...)...)
	require.Equal(t, 0, res.code, res.stderr)
	var keys []keySummary
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	for dec.More() {
		var k keySummary
		require.NoError(t, dec.Decode(&k))
		keys = append(keys, k)
	}
	return keys
}

// keyNames is keysJSON's keys, sorted.
func (b *testBundle) keyNames(t *testing.T, args ...string) []string {
	t.Helper()
	var names []string
	for _, k := range b.keysJSON(t, args...) {
		names = append(names, k.Key)
	}
	sort.Strings(names)
	return names
}
