package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"-workers", "0, 2", "-modes", "tenant", "-clients", "4", "-node-cores", "2"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{0, 2}, o.workers)
	require.Equal(t, []string{"tenant"}, o.modes)
	require.Equal(t, 4, o.clients)
	for _, bad := range [][]string{
		{"-workers", "x"}, {"-workers", "-1"}, {"-modes", "nearest"}, {"-clients", "0"},
		{"-duration", "0s"}, {"-node-cores", "-2"}, {"stray"},
	} {
		_, err := parseFlags(bad, io.Discard)
		require.Error(t, err, "%q", bad)
	}
}

// A short run (with -diagnose) on plain PostgreSQL (and on Citus with one worker, where
// Citus is installed in the PostgreSQL the harness finds) measures both
// designs and verifies every answered request.
func TestRunMeasuresAndVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts durable servers")
	}
	bin, err := pgtemp.FindBinaries()
	if errors.Is(err, pgtemp.ErrNoBinaries) {
		t.Skip("no PostgreSQL binaries")
	}
	require.NoError(t, err)
	workers := []int{0}
	if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output(); err == nil {
		if _, err := os.Stat(filepath.Join(strings.TrimSpace(string(out)), "citus.so")); err == nil {
			workers = append(workers, 1)
		}
	}
	o := &options{workers: workers, modes: []string{"coordinator", "any", "tenant"}, clients: 2, tenants: 20, shards: 4,
		duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond, rounds: 1, diagnose: true}
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), o, &out), "%s", out.String())
	t.Log(out.String())
	require.Contains(t, out.String(), "| plain PostgreSQL | unpinned |")
	require.Contains(t, out.String(), "every measurement verified")
	require.Contains(t, out.String(), "direct, atomicphase: p50 ")
	require.Contains(t, out.String(), "wait events (mean backends per")
	require.Contains(t, out.String(), "slowest 1%")
	if len(workers) > 1 {
		require.Contains(t, out.String(), "| Citus, 1 worker, → tenant's worker |")
	}
}

// A run interrupted (SIGINT or SIGTERM cancel its context) in the middle
// of a measurement ends, with its servers stopped and their data
// directories gone. Not parallel: it sets TMPDIR, where the durable
// servers keep their data, to find them.
func TestRunStopsAndCleansUpWhenInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a durable server")
	}
	if _, err := pgtemp.FindBinaries(); errors.Is(err, pgtemp.ErrNoBinaries) {
		t.Skip("no PostgreSQL binaries")
	}
	// A directory the server's OS user can reach (run as root, it runs as
	// postgres), which t.TempDir's parent is not.
	tmp, err := os.MkdirTemp("", "bench-scale-interrupt-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o777))
	t.Setenv("TMPDIR", tmp)
	o := &options{workers: []int{0}, modes: []string{"coordinator"}, clients: 2, tenants: 20, shards: 4,
		duration: time.Hour, warmup: 100 * time.Millisecond, rounds: 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, out) }()
	deadline := time.After(2 * time.Minute) // a bound on a hung start, not a timing
	for !strings.Contains(out.String(), "plain PostgreSQL: 1 server") {
		select {
		case err := <-done:
			t.Fatalf("the run ended before it was interrupted: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("the run never reached its first measurement:\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NotEmpty(t, serversIn(t, tmp), "a server runs from the test's TMPDIR")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Minute):
		t.Fatal("the run did not end after its context was cancelled")
	}
	var left []os.DirEntry
	require.Eventually(t, func() bool { return len(serversIn(t, tmp)) == 0 }, time.Minute, 50*time.Millisecond,
		"no server is left running")
	left, err = os.ReadDir(tmp)
	require.NoError(t, err)
	for _, e := range left {
		require.False(t, strings.HasPrefix(e.Name(), "atomicphase"), "data directory %s removed", e.Name())
	}
}

// serversIn lists the processes whose command line names dir.
func serversIn(t *testing.T, dir string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	var out []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) && strings.Contains(string(b), "postgres") {
			out = append(out, p)
		}
	}
	return out
}

// lockedBuffer is a buffer run writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
