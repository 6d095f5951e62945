package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, nil)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--database-url", b.db.URL, "keys"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Equal(t, "no keys match\n", stdout.String())
}

func TestHelp(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, "", "--help")
	require.Equal(t, 0, res.code)
	for _, sub := range []string{"migrate", "keys", "inspect", "resume", "unpark", "forget", "reap", "sweep", "--database-url", "--schema", "--lock-timeout"} {
		require.Contains(t, res.stdout, sub)
	}

	res = runCLI(t, nil, "", "resume", "--help")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "The CLI cannot run the key's phases")

	res = runCLI(t, nil, "", "sweep", "--help")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "with no workflow\nregistered")
	require.Contains(t, res.stdout, "resumes no key")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"keys", "--colour"}, "unknown flag: --colour"},
		{[]string{"keys", "extra"}, `unexpected argument "extra"`},
		{[]string{"keys", "--status", "done"}, `--status "done" is not a key status; use one of in_progress, stale, abandoned, unknown, parked, finished`},
		{[]string{"keys", "--limit", "0"}, "--limit 0"},
		{[]string{"keys", "--older-than", "soon"}, `invalid argument "soon"`},
		{[]string{"inspect", "only-scope"}, "inspect takes two arguments, SCOPE and KEY; got 1"},
		{[]string{"forget", "a", "b", "c"}, "forget takes two arguments, SCOPE and KEY; got 3"},
		{[]string{"--lock-timeout", "0s", "keys"}, "--lock-timeout 0s is too short"},
		{[]string{"reap"}, "reap needs --older-than DURATION"},
		{[]string{"reap", "--older-than", "-1h"}, "--older-than -1h0m0s is negative"},
		{[]string{"sweep"}, "sweep runs once and exits: pass --once"},
		{[]string{"sweep", "--once", "--retention", "0"}, "--retention 0 would mean the library's default"},
	} {
		res := runCLI(t, nil, "", tc.args...)
		require.Equal(t, exitUsage, res.code, "%v: %s", tc.args, res.stderr)
		require.Contains(t, res.stderr, tc.want, "%v", tc.args)
		require.True(t, strings.HasPrefix(res.stderr, "atomicphase: "), "%v: %s", tc.args, res.stderr)
		require.Contains(t, res.stderr, "--help", "%v", tc.args)
	}
}
