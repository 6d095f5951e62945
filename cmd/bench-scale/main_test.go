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
