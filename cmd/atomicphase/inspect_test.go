package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestInspectText(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res := b.run(t, "inspect", "alice", "finished-1")
	require.Equal(t, 0, res.code, res.stderr)
	out := res.stdout
	for _, re := range []string{
		`(?m)^scope: +alice$`,
		`(?m)^key: +finished-1$`,
		`(?m)^workflow: +checkout$`,
		`(?m)^status: +finished$`,
		`(?m)^recovery point: +finished$`,
		`(?m)^locked: +no$`,
		`(?m)^attempts: +1$`,
		`(?m)^last error: +-$`,
		`(?m)^finished at: +\d{4}-\S+Z$`,
		`(?m)^response status: +201$`,
		`(?m)^response header: +Content-Type: application/json$`,
		`(?m)^state: +- \(cleared once finished\)$`,
		`(?m)^response body \(text, 15 bytes\):\n  \{"order":"o-1"\}$`,
	} {
		require.Regexp(t, re, out)
	}

	res = b.run(t, "inspect", "alice", "binary-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "response body (base64, 5 bytes):\n  "+base64.StdEncoding.EncodeToString(binaryBody)+"\n")

	res = b.run(t, "inspect", "bob", "parked-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^status: +parked$`, res.stdout)
	require.Regexp(t, `(?m)^last error: +phase "payout": `+lastErrorParked, res.stdout) // whole, not cut
	require.Regexp(t, `(?m)^parked at: +\d{4}-\S+Z$`, res.stdout)
	require.Regexp(t, `(?m)^response: +- \(not finished\)$`, res.stdout)
	require.Contains(t, res.stdout, "state (as stored):\n  {\"Item\":\"parked-1\"}\n")

	res = b.run(t, "inspect", "carol", "stale-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^locked: +yes, stale for \d\S*s$`, res.stdout)
	res = b.run(t, "inspect", "carol", "running-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^locked: +yes, goes stale in \d\S*s$`, res.stdout)
}

func TestInspectJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)

	inspect := func(scope, key string) keyDetail {
		res := b.run(t, "inspect", "--json", scope, key)
		require.Equal(t, 0, res.code, res.stderr)
		var d keyDetail
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &d))
		return d
	}

	d := inspect("alice", "finished-1")
	require.Equal(t, "finished", d.Status)
	require.NotNil(t, d.Response)
	require.Equal(t, 201, d.Response.Status)
	require.Equal(t, "text", d.Response.BodyEncoding)
	require.JSONEq(t, `{"order":"o-1"}`, d.Response.Body)
	require.Equal(t, "application/json", d.Response.Header.Get("Content-Type"))
	require.Equal(t, "null", string(d.State)) // cleared once finished

	d = inspect("alice", "binary-1")
	require.Equal(t, "base64", d.Response.BodyEncoding)
	body, err := base64.StdEncoding.DecodeString(d.Response.Body)
	require.NoError(t, err)
	require.Equal(t, binaryBody, body)

	d = inspect("bob", "abandoned-1")
	require.Equal(t, "abandoned", d.Status)
	require.Nil(t, d.Response)
	require.JSONEq(t, `{"Item":"abandoned-1"}`, string(d.State))
	require.Contains(t, *d.LastError, lastErrorAbandoned)
	require.NotNil(t, d.NextAttemptAt)

	d = inspect("carol", "running-1")
	require.True(t, d.Locked)
	require.NotZero(t, d.LockToken)
	require.NotNil(t, d.LockExpiresIn)
	require.Positive(t, *d.LockExpiresIn)
}

func TestInspectUnknownKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "inspect", "alice", "no-such-key")
	require.Equal(t, exitFailure, res.code)
	require.Empty(t, res.stdout)
	require.Contains(t, res.stderr, `no key "no-such-key" in scope "alice"`)
	require.Contains(t, res.stderr, "atomicphase keys --scope alice")

	// The key exists, under another scope: scopes keep keys apart.
	res = b.run(t, "inspect", "bob", "finished-1")
	require.Equal(t, exitFailure, res.code)
	require.Contains(t, res.stderr, `no key "finished-1" in scope "bob"`)
}

// A phase panics with a value a client supplied: the stored error holds the
// panic's stack over many lines, and an OSC hyperlink and a screen clear.
// inspect shows the stack line by line, and the escapes written out, so
// nothing in the key row reaches the operator's terminal raw.
func TestInspectShowsAPanicsStackAndEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, nil)
	type state struct{ Name string }
	const name = "\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\x1b[2J"
	wf := atomicphase.MustWorkflow("greet", func(_ struct{}, _ *atomicphase.Request) (state, error) {
		return state{Name: name}, nil
	}, []atomicphase.Phase[state]{
		atomicphase.Local("greet", func(_ context.Context, _ atomicphase.Tx, s *state) (atomicphase.Outcome, error) {
			panic("cannot greet " + s.Name)
		}),
	}, nil)
	func() {
		defer func() { require.NotNil(t, recover(), "the panic goes on to the caller") }()
		_, _ = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "eve", Key: "p-1", Method: "POST", Path: "/greet"})
	}()
	info := b.inspect(t, "eve", "p-1")
	require.NotNil(t, info.LastError)
	require.Contains(t, *info.LastError, "\x1b]8;;", "the row holds the raw text")

	res := b.run(t, "inspect", "eve", "p-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.NotContains(t, res.stdout, "\x1b", "no escape reaches the terminal")
	require.NotContains(t, res.stdout, "\x07")
	require.Regexp(t, `(?m)^last error: +.*panic: cannot greet \\x1b\]8;;http://evil\.example/\\x07click.*\(\d+ more lines below\)$`, res.stdout)
	require.Contains(t, res.stdout, "last error (whole):\n")
	require.Regexp(t, `(?m)^  goroutine \d+ \[running\]:$`, res.stdout, "the stack, a line at a time")
	require.Contains(t, res.stdout, `\x1b[2J`)
}

// The downstream key a foreign phase sent, which a partner asks for first:
// the CLI has no workflow code, so it shows that of each phase named, the
// reference the downstream was sent, in text and JSON.
func TestInspectShowsTheDownstreamKeysOfNamedPhases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sent []string
	b.refs.Range(func(k, _ any) bool { sent = append(sent, k.(string)); return true })
	require.NotEmpty(t, sent)

	res := b.run(t, "inspect", "carol", "running-1", "--phase", "label")
	require.Equal(t, 0, res.code, res.stderr)
	m := regexp.MustCompile(`(?m)^downstream key \(label\): +(\S+)$`).FindStringSubmatch(res.stdout)
	require.NotNil(t, m, res.stdout)
	require.Contains(t, sent, m[1], "the reference the label call was sent with")

	res = b.run(t, "inspect", "carol", "running-1", "--phase", "label", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var d struct {
		DownstreamKeys map[string]string `json:"downstream_keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &d))
	require.Equal(t, m[1], d.DownstreamKeys["label"])

	res = b.run(t, "inspect", "carol", "running-1")
	require.NotContains(t, res.stdout, "downstream key", "no phase named, none known here")
}
