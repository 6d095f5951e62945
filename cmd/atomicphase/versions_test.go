package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The service records the versions it runs (its sweep does, on every
	// run).
	require.NoError(t, b.runner.RecordVersions(b.ctx))

	res := b.run(t, "versions")
	require.Equal(t, 0, res.code, res.stderr)
	t.Logf("\n%s", res.stdout)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Regexp(t, `^WORKFLOW +VERSION +DEPLOYED +LAST SEEN +UNFINISHED +PARKED +UNKNOWN +OLDEST +PHASES$`, lines[0])
	rows := map[string]string{}
	for _, l := range lines[1:] {
		rows[strings.Fields(l)[0]] = l
	}
	require.Regexp(t, `^checkout +v[0-9a-f]{10} +yes +\S+ ago +0 +0 +0 +drained +charge$`, rows["checkout"])
	require.Regexp(t, `^payout +v[0-9a-f]{10} +yes +\S+ ago +1 +1 +0 +\S+ old +payout$`, rows["payout"])
	require.Regexp(t, `^ship +v[0-9a-f]{10} +yes +\S+ ago +2 +0 +0 +\S+ old +label,done$`, rows["ship"])

	res = b.run(t, "versions", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var n int
	for _, l := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		var v versionSummary
		require.NoError(t, json.Unmarshal([]byte(l), &v))
		if v.Workflow == "refund" {
			require.Equal(t, 1, v.Unfinished)
			require.False(t, v.Drained)
			require.True(t, v.Deployed)
		}
		n++
	}
	require.Equal(t, 5, n, "one line per workflow version")

	res = b.run(t, "versions", "--horizon", "0s")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "--horizon")
}
