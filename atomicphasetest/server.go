package atomicphasetest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/atomicphase/atomicphase/internal/connstr"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// Server is a PostgreSQL server a test or example can create databases on.
type Server struct {
	// URL connects to the server's maintenance database as a role that
	// may create databases.
	URL string
	// Kind says where the server came from: "env", "local" or "docker".
	Kind string
	stop func() error
}

// Stop shuts down a server this package started and removes its files. It
// does nothing for a server given by URL.
func (s *Server) Stop() error {
	if s == nil || s.stop == nil {
		return nil
	}
	stop := s.stop
	s.stop = nil
	return stop()
}

// URLFromEnv returns TEST_DATABASE_URL, else DATABASE_URL, else "".
func URLFromEnv() string { return pgtemp.URLFromEnv() }

// StartServer starts a throwaway PostgreSQL: from local binaries if there
// are any, else in a Docker container if an engine answers. The error names
// every option when neither works. logf, if not nil, is told what happened.
func StartServer(ctx context.Context, logf func(format string, args ...any)) (*Server, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var reasons []string
	local, err := pgtemp.Start(ctx)
	if err == nil {
		logf("started a throwaway PostgreSQL from %s at %s", local.Bin, connstr.Display(local.URL))
		return &Server{URL: local.URL, Kind: "local", stop: local.Stop}, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	srv, err := startDocker(ctx)
	if err == nil {
		logf("started a throwaway PostgreSQL in Docker at %s", connstr.Display(srv.URL))
		return srv, nil
	}
	reasons = append(reasons, "docker: "+err.Error())
	return nil, noServerError(reasons)
}

func noServerError(reasons []string) error {
	return errors.New("atomicphasetest: no PostgreSQL available. Either\n" +
		"  1. set TEST_DATABASE_URL (or DATABASE_URL) to a server where the role may CREATE DATABASE, or\n" +
		"  2. install PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin\n" +
		"     (Debian/Ubuntu: apt-get install postgresql), or name their directory in ATOMICPHASE_TEST_PG_BIN\n" +
		"     (scripts/postgres-version MAJOR unpacks one from npm), or\n" +
		"  3. start a Docker engine, so a postgres container can be run.\n" +
		"What was tried:\n  - " + strings.Join(reasons, "\n  - "))
}

// withDatabase returns url pointed at database name.
func withDatabase(url, name string) (string, error) {
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		rest := url[strings.Index(url, "://")+3:]
		query := ""
		if q := strings.IndexByte(rest, '?'); q >= 0 {
			rest, query = rest[:q], rest[q:]
		}
		host := rest
		if slash := strings.IndexByte(rest, '/'); slash >= 0 {
			host = rest[:slash]
		}
		return url[:strings.Index(url, "://")+3] + host + "/" + name + query, nil
	}
	if strings.Contains(url, "=") || url == "" {
		return strings.TrimSpace(url + " dbname=" + name), nil
	}
	return "", fmt.Errorf("atomicphasetest: cannot make a connection string for database %q from %q", name, connstr.Display(url))
}
