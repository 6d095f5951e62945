package faultinject_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

func TestParse(t *testing.T) {
	t.Parallel()
	rules, err := faultinject.Parse("charge:after-foreign:exit, shop/create_order:before-commit:delay:2s,*:after-acquire:crash")
	require.NoError(t, err)
	require.Equal(t, []faultinject.Rule{
		{Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Exit},
		{Workflow: "shop", Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.Delay, Delay: 2 * time.Second},
		{Place: atomicphase.AfterAcquire, Action: faultinject.Crash},
	}, rules)

	rules, err = faultinject.Parse("")
	require.NoError(t, err)
	require.Empty(t, rules)
}

func TestParseAcceptsEveryPlace(t *testing.T) {
	t.Parallel()
	for _, place := range atomicphase.FaultPlaces() {
		rules, err := faultinject.Parse("*:" + string(place) + ":error")
		require.NoError(t, err)
		require.Equal(t, []faultinject.Rule{{Place: place, Action: faultinject.Error}}, rules)
	}
	_, err := faultinject.Parse("*:nowhere:error")
	require.ErrorContains(t, err, "one of before-acquire, after-acquire, before-phase, after-foreign, before-response, before-commit, after-commit")
}

func TestParseRejectsMalformedRules(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"charge:after-foreign":            "3 or 4 colon-separated fields",
		"charge:after-foreign:exit:1:2":   "3 or 4 colon-separated fields",
		":after-foreign:exit":             "empty phase",
		"/charge:after-foreign:exit":      "empty workflow",
		"charge:during-lunch:exit":        `unknown place "during-lunch"`,
		"charge:after-foreign:explode":    `unknown action "explode"`,
		"charge:after-foreign:crash:5s":   "takes no argument",
		"charge:after-foreign:delay:soon": "not a duration",
		"charge:after-foreign:exit,oops":  `"oops"`,
	}
	for spec, want := range cases {
		_, err := faultinject.Parse(spec)
		require.ErrorContains(t, err, want, spec)
		require.ErrorContains(t, err, faultinject.EnvVar, "the error names the variable")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(faultinject.EnvVar, "")
	inj, err := faultinject.FromEnv()
	require.NoError(t, err)
	require.Nil(t, inj)

	t.Setenv(faultinject.EnvVar, "charge:after-foreign:error")
	inj, err = faultinject.FromEnv()
	require.NoError(t, err)
	require.NotNil(t, inj)

	t.Setenv(faultinject.EnvVar, "nonsense")
	_, err = faultinject.FromEnv()
	require.Error(t, err)
}

// childEnv marks the test binary re-executed as a stand-in server process.
const childEnv = "FAULTINJECT_CHILD"

// childResult is what a child process reports of its one attempt.
type childResult struct {
	Status     int    `json:"status,omitempty"`
	Body       []byte `json:"body,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
	InProgress bool   `json:"in_progress,omitempty"`
	Error      string `json:"error,omitempty"`
}

// childMain is a stand-in server process: it sends the shop request once
// through a Runner whose faults come from ATOMICPHASE_FAULTS, and reports.
func childMain() int {
	inj, err := faultinject.FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{FaultInjector: inj})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	resp, err := runner.Run(ctx, testshop.Workflow(os.Getenv("DOWNSTREAM_URL"), pool, testshop.Sound), testshop.Request())
	var out childResult
	switch {
	case err == nil:
		out = childResult{Status: resp.Status, Body: resp.Body, Replayed: resp.Replayed}
	case errors.Is(err, atomicphase.ErrInProgress):
		out = childResult{InProgress: true}
	default:
		out = childResult{Error: err.Error()}
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

func runChild(t *testing.T, dbURL, downURL, faults string) (childResult, *os.ProcessState) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "DATABASE_URL="+dbURL, "DOWNSTREAM_URL="+downURL,
		faultinject.EnvVar+"="+faults)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("child: %v", err)
	}
	var res childResult
	if stdout.Len() > 0 {
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), "child stdout %q stderr %q", stdout.String(), stderr.String())
	}
	if cmd.ProcessState.ExitCode() > 0 {
		res.Error = stderr.String()
	}
	return res, cmd.ProcessState
}

// TestProcessKillAtEveryPoint SIGKILLs a real process at every fault point
// through the exit action, restarts it against the same database, retries
// the request to completion, and checks the invariants.
func TestProcessKillAtEveryPoint(t *testing.T) {
	t.Parallel()
	// A clean in-process run names the points and the expected response.
	db := atomicphasetest.NewDB(t, shopDB)
	rec := faultinject.New()
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: rec})
	require.NoError(t, err)
	want, err := runner.Run(context.Background(), testshop.Workflow(newPayments(t).URL, db.Pool, testshop.Sound), testshop.Request())
	require.NoError(t, err)

	seen := map[atomicphase.FaultPoint]bool{}
	for _, p := range rec.Passed() {
		if seen[p.Point] {
			continue
		}
		seen[p.Point] = true
		phase := p.Point.Phase
		if phase == "" {
			phase = "*"
		}
		spec := fmt.Sprintf("%s/%s:%s:exit", p.Point.Workflow, phase, p.Point.Place)
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			db := atomicphasetest.NewDB(t, shopDB)
			down := newPayments(t)

			_, state := runChild(t, db.URL, down.URL, spec)
			ws, ok := state.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child died by SIGKILL at %s: %v", spec, state)

			var final childResult
			for attempt := 0; attempt < 6 && final.Status == 0; attempt++ {
				// The restarted process meets the dead one's lock once the
				// lock timeout has passed.
				require.NoError(t, atomicphasetest.AgeLocks(context.Background(), db.Pool, atomicphase.DefaultLockTimeout))
				final, _ = runChild(t, db.URL, down.URL, "")
			}
			require.Equal(t, want.Status, final.Status, "final answer after the restart: %+v", final)
			require.NoError(t, testshop.Check(context.Background(), db.Pool, down, final.Body))

			again, _ := runChild(t, db.URL, down.URL, "")
			require.True(t, again.Replayed)
			require.Equal(t, final.Body, again.Body)
		})
	}
	require.Len(t, seen, 10)
}

func TestMalformedFaultsAreAStartUpError(t *testing.T) {
	t.Parallel()
	res, state := runChild(t, "postgres://unused", "http://unused", "charge:after-foreign:explode")
	require.Equal(t, 2, state.ExitCode())
	require.Contains(t, res.Error, faultinject.EnvVar)
	require.Contains(t, res.Error, `unknown action "explode"`)
}
