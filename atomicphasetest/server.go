// Package atomicphasetest hands tests a real, migrated PostgreSQL database,
// so applications can test their own workflows the way atomicphase tests
// itself: against the real key store, never a mock.
//
// The server comes from, in order: TEST_DATABASE_URL or DATABASE_URL if set
// (the role needs CREATEDB); else a throwaway cluster started from local
// PostgreSQL binaries (found on PATH or under /usr/lib/postgresql/*/bin; when
// the process runs as root, the server runs as the postgres OS user); else a
// container started through dockertest when a Docker engine answers; else
// the test fails naming all three options.
//
// Each NewDB call gets its own database, cloned in milliseconds from a
// template that was migrated once per process. A throwaway cluster lives in
// /dev/shm when there is room, where a clone takes ~20ms instead of ~300ms. A throwaway server and its
// temporary directory are removed when the test binary exits, even if it is
// killed: a watchdog process outlives it just long enough to clean up.
//
//	func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }
//
//	func TestCharge(t *testing.T) {
//		db := atomicphasetest.NewDB(t, nil)
//		runner, err := atomicphase.NewRunner(db.Pool, nil)
//		...
//	}
package atomicphasetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Server is a PostgreSQL server a test or example can create databases on.
type Server struct {
	// URL connects to the server's maintenance database as a role that
	// may create databases.
	URL string
	// Kind says where the server came from: "env", "local" or "docker".
	Kind string
	stop func() error
	dir  string // a local server's temporary directory
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
func URLFromEnv() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return os.Getenv("DATABASE_URL")
}

// StartServer starts a throwaway PostgreSQL: from local binaries if there
// are any, else in a Docker container if an engine answers. The error names
// every option when neither works. logf, if not nil, is told what happened.
func StartServer(ctx context.Context, logf func(format string, args ...any)) (*Server, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var reasons []string
	if bin, err := findBinaries(); err != nil {
		reasons = append(reasons, "local binaries: "+err.Error())
	} else {
		srv, err := startLocal(ctx, bin)
		if err == nil {
			logf("started a throwaway PostgreSQL from %s at %s", bin, redact(srv.URL))
			return srv, nil
		}
		reasons = append(reasons, "local binaries in "+bin+": "+err.Error())
	}
	srv, err := startDocker(ctx)
	if err == nil {
		logf("started a throwaway PostgreSQL in Docker at %s", redact(srv.URL))
		return srv, nil
	}
	reasons = append(reasons, "docker: "+err.Error())
	return nil, noServerError(reasons)
}

func noServerError(reasons []string) error {
	return errors.New("atomicphasetest: no PostgreSQL available. Either\n" +
		"  1. set TEST_DATABASE_URL (or DATABASE_URL) to a server where the role may CREATE DATABASE, or\n" +
		"  2. install PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin\n" +
		"     (Debian/Ubuntu: apt-get install postgresql), or\n" +
		"  3. start a Docker engine, so a postgres container can be run.\n" +
		"What was tried:\n  - " + strings.Join(reasons, "\n  - "))
}

// redact hides a password in a URL for logs.
func redact(url string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		if at := strings.Index(url[i+3:], "@"); at >= 0 {
			cred := url[i+3 : i+3+at]
			if user, _, ok := strings.Cut(cred, ":"); ok {
				return url[:i+3] + user + ":***" + url[i+3+at:]
			}
		}
	}
	return url
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
	return "", fmt.Errorf("atomicphasetest: cannot make a connection string for database %q from %q", name, redact(url))
}
