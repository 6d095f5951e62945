// Package pgtemp starts a throwaway PostgreSQL from the server binaries
// installed on the machine (initdb and postgres), for tests, examples and
// development servers that were given no DATABASE_URL.
//
// It links no test machinery (no testing, no Docker client), so a server
// binary may use it. The test harness, atomicphasetest, builds on it and
// adds a Docker fallback.
//
// A cluster is initialised in a new temporary directory (on /dev/shm when
// there is room, where cloning a database is ten times faster than on a
// disk; on a disk for a durable server, see Options), listens on a free loopback port, trusts local connections as the
// postgres role, and runs as the postgres OS user when the process is root
// (PostgreSQL refuses to run as root). Stop shuts it down and removes the
// directory; if the process dies first, even by SIGKILL, a watchdog process
// does the same shortly after.
//
// StartBouncer puts a throwaway PgBouncer in transaction pooling mode in
// front of a server, started and cleaned up the same way.
package pgtemp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Server is a running throwaway PostgreSQL cluster.
type Server struct {
	// URL connects to the cluster's postgres database as the postgres
	// superuser.
	URL string
	// Bin is the directory of the server binaries it was started from.
	Bin string

	dir  string // the cluster's temporary directory
	stop func() error
}

// Options configure StartWith. The zero value is what Start uses: a
// server tuned for tests, which survives a process crash but not an OS
// crash.
type Options struct {
	// Durable starts the server with production durability: fsync,
	// synchronous_commit and full_page_writes on (the test settings turn
	// all three off), with its directory on a disk (os.TempDir) rather
	// than in /dev/shm, where an fsync costs nothing. For benchmarks whose
	// numbers must hold on a real server; tests leave it off.
	Durable bool
	// Settings are extra server settings, each "name=value" (as in
	// postgresql.conf, e.g. "shared_preload_libraries=pg_stat_statements"),
	// passed to postgres with -c after the defaults, so that they override
	// them.
	Settings []string
	// Cores, when set, is the list of CPUs the server runs on, in
	// taskset's syntax ("0-7", "0,2,4"): a benchmark keeps the server off
	// its clients' cores. It needs the taskset program.
	Cores string
}

// Start initialises and starts a throwaway cluster from local binaries,
// found on PATH or under /usr/lib/postgresql/*/bin (newest first), with the
// test settings (see Options). The error wraps ErrNoBinaries when there are
// none. ctx bounds the start-up only; the server runs until Stop or the end
// of the process.
func Start(ctx context.Context) (*Server, error) {
	return StartWith(ctx, nil)
}

// StartWith is Start with options; nil means Start's defaults.
func StartWith(ctx context.Context, opts *Options) (*Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	for _, s := range opts.Settings {
		if name, _, ok := strings.Cut(s, "="); !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("pgtemp: server setting %q is not name=value", s)
		}
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	srv, err := startCluster(ctx, bin, opts)
	if err != nil {
		return nil, fmt.Errorf("in %s: %w", bin, err)
	}
	return srv, nil
}

// DataDir returns the cluster's data directory.
func (s *Server) DataDir() string { return filepath.Join(s.dir, "data") }

// Stop shuts the server down (fast shutdown, then a kill after ten
// seconds) and removes its directory. Stopping a nil or stopped server does
// nothing.
func (s *Server) Stop() error {
	if s == nil || s.stop == nil {
		return nil
	}
	stop := s.stop
	s.stop = nil
	return stop()
}

// URLFromEnv returns TEST_DATABASE_URL, else DATABASE_URL, else "".
func URLFromEnv() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return os.Getenv("DATABASE_URL")
}
