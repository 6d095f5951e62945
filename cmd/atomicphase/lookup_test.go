package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A downstream key (what a webhook quotes) leads back to its key, in its
// scope only, when the operator names the workflow and the phase.
func TestLookupADownstreamKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var refs []string
	b.refs.Range(func(k, _ any) bool { refs = append(refs, k.(string)); return true })
	require.Len(t, refs, 2, "carol's two blocked calls")
	for _, ref := range refs {
		want, err := b.runner.FindDownstreamKey(b.ctx, "carol", ref) // this process has the workflow
		require.NoError(t, err)
		res := b.run(t, "lookup", "carol", ref, "--workflow", "ship", "--phase", "label")
		require.Equal(t, 0, res.code, res.stderr)
		require.Equal(t, "key "+want.Key.Key+" in scope carol (workflow ship, "+string(want.Key.Status)+") sent it from phase label\n"+
			"next: atomicphase inspect carol "+want.Key.Key+"\n", res.stdout)

		res = b.run(t, "lookup", "bob", ref, "--workflow", "ship", "--phase", "label")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, `no key of workflow "ship" in scope "bob" sent`)
	}
	res := b.run(t, "lookup", "carol", refs[0])
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, "--workflow and at least one --phase are required")
}
