package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// The keys setup builds, one per status (two finished ones: one answered
// with text, one with bytes that are not UTF-8).
const (
	lastErrorAbandoned = "downstream 503: the card network did not answer within 30 seconds\nretry later"
	lastErrorParked    = "account closed: payouts to it are refused"
)

var binaryBody = []byte{0xff, 0xfe, 0x00, 0x01, 'x'}

type testBundle struct {
	db     *atomicphasetest.DB
	runner *atomicphase.Runner
	ctx    context.Context
	// refs are the downstream keys the blocked foreign calls were sent.
	refs sync.Map
}

// setup gives the test a migrated database of its own holding a key in
// every status, built by the library itself:
//
//	alice/finished-1   checkout  finished   text response
//	alice/binary-1     export    finished   response body not UTF-8
//	bob/abandoned-1    refund    abandoned  its phase returned an error
//	bob/parked-1       payout    parked     its phase failed permanently
//	carol/running-1    ship      in_progress  its foreign call is blocked
//	carol/stale-1      ship      stale      blocked, lock aged by an hour
//
// The blocked calls are released, and their runs waited for, when the test
// ends.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := setupEmpty(t, nil)
	type state struct{ Item string }
	start := func(_ struct{}, req *atomicphase.Request) (state, error) { return state{Item: req.Key}, nil }
	respond := func(status int, body []byte) atomicphase.LocalFunc[state] {
		return func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
			return atomicphase.Respond(status, body).WithHeader("Content-Type", "application/json"), nil
		}
	}
	fail := func(err error) atomicphase.LocalFunc[state] {
		return func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, err
		}
	}
	release, entered := make(chan struct{}), make(chan struct{}, 2)
	block := func(ctx context.Context, call *atomicphase.ForeignCall, _ *state) error {
		return call.Do(ctx, func(_ context.Context, ref string) error {
			b.refs.Store(ref, true)
			entered <- struct{}{}
			<-release
			return nil
		})
	}
	workflows := map[string]*atomicphase.Workflow[state]{
		"checkout": atomicphase.MustWorkflow("checkout", start, []atomicphase.Phase[state]{
			atomicphase.Local("charge", respond(201, []byte(`{"order":"o-1"}`)))}, nil),
		"export": atomicphase.MustWorkflow("export", start, []atomicphase.Phase[state]{
			atomicphase.Local("render", respond(200, binaryBody))}, nil),
		"refund": atomicphase.MustWorkflow("refund", start, []atomicphase.Phase[state]{
			atomicphase.Local("refund", fail(errors.New(lastErrorAbandoned)))}, nil),
		"payout": atomicphase.MustWorkflow("payout", start, []atomicphase.Phase[state]{
			atomicphase.Local("payout", fail(atomicphase.Permanent(errors.New(lastErrorParked))))}, nil),
		"ship": atomicphase.MustWorkflow("ship", start, []atomicphase.Phase[state]{
			atomicphase.Foreign("label", block, nil),
			atomicphase.Local("done", respond(200, []byte(`{}`)))}, nil),
	}
	runKey := func(workflow, scope, key string) (*atomicphase.Response, error) {
		return b.runner.Run(b.ctx, workflows[workflow], atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/" + workflow})
	}
	for _, k := range []struct{ workflow, scope, key string }{
		{"checkout", "alice", "finished-1"}, {"export", "alice", "binary-1"},
		{"refund", "bob", "abandoned-1"}, {"payout", "bob", "parked-1"},
	} {
		_, _ = runKey(k.workflow, k.scope, k.key) // the failures are the point
	}

	var wg sync.WaitGroup
	for _, key := range []string{"running-1", "stale-1"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = runKey("ship", "carol", key)
		}()
	}
	t.Cleanup(func() { close(release); wg.Wait() })
	for range 2 {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the blocked foreign calls did not start")
		}
	}
	b.exec(t, `UPDATE idempotency_keys SET locked_at = now() - interval '1 hour', next_attempt_at = created_at, status = 'r' WHERE idempotency_key = 'stale-1'`)
	// The failed key rests in its backoff however slowly this ran: the
	// backoff after a first failure is a second at most.
	b.exec(t, `UPDATE idempotency_keys SET next_attempt_at = now() + interval '1 hour' WHERE idempotency_key = 'abandoned-1'`)

	want := map[string]atomicphase.KeyStatus{
		"finished-1": atomicphase.KeyFinished, "binary-1": atomicphase.KeyFinished,
		"abandoned-1": atomicphase.KeyAbandoned, "parked-1": atomicphase.KeyParked,
		"running-1": atomicphase.KeyInProgress, "stale-1": atomicphase.KeyStale,
	}
	keys, err := b.runner.ListKeys(b.ctx, nil)
	require.NoError(t, err)
	got := map[string]atomicphase.KeyStatus{}
	for _, k := range keys {
		got[k.Key] = k.Status
	}
	require.Equal(t, want, got, "setup built the wrong statuses")
	return b
}

// setupEmpty gives the test a database of its own, migrated unless opts
// says otherwise, and a Runner on it.
func setupEmpty(t *testing.T, opts *atomicphasetest.Options) *testBundle {
	t.Helper()
	db := atomicphasetest.NewDB(t, opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	return &testBundle{db: db, runner: runner, ctx: context.Background()}
}

// result is what one run of the CLI did.
type result struct {
	code           int
	stdout, stderr string
}

// run runs the CLI against the test's database, with no environment and
// empty standard input.
func (b *testBundle) run(t *testing.T, args ...string) result {
	t.Helper()
	return b.runInput(t, "", args...)
}

// runInput is run with stdin as standard input.
func (b *testBundle) runInput(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCLI(t, nil, stdin, append([]string{"--database-url", b.db.URL}, args...)...)
}

// runCLI runs the CLI in-process with env as its whole environment.
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	c := &cli{stdin: strings.NewReader(stdin), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return env[k] }}
	code := c.run(ctx, args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err)
}

func (b *testBundle) inspect(t *testing.T, scope, key string) *atomicphase.KeyInfo {
	t.Helper()
	info, err := b.runner.Inspect(b.ctx, scope, key)
	require.NoError(t, err)
	return info
}

func (b *testBundle) keyExists(t *testing.T, key string) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1", key).Scan(&n))
	return n == 1
}

// TestBinary builds the command and runs it as a process, to prove main's
// wiring: arguments, DATABASE_URL from the environment, output and exit
// codes.
func TestBinary(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, nil)
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the test builds the command with the go tool, which must be on PATH")
	bin := filepath.Join(t.TempDir(), "atomicphase")
	build := exec.Command(goBin, "build", "-buildvcs=false", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	env := func(url string) []string {
		var e []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "DATABASE_URL=") {
				e = append(e, kv)
			}
		}
		return append(e, "DATABASE_URL="+url)
	}
	cmd := exec.Command(bin, "migrate")
	cmd.Env = env(b.db.URL)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "up to date")

	cmd = exec.Command(bin, "inspect", "nobody", "nothing")
	cmd.Env = env(b.db.URL)
	out, err = cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, exitFailure, exitErr.ExitCode())
	require.Contains(t, string(out), `no key "nothing" in scope "nobody"`)

	cmd = exec.Command(bin, "keys")
	cmd.Env = env("")
	out, err = cmd.CombinedOutput()
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, exitFailure, exitErr.ExitCode())
	require.Contains(t, string(out), "no database given: set DATABASE_URL")
}
