// Package app is the Rocket Rides example server: POST /rides books a ride
// and charges the rider's card, safely retryable with an Idempotency-Key,
// on atomicphase. examples/rocketrides/README.md describes its behaviour:
// start-up, environment, answers, the payment API call and the invariants.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// Config is the server's configuration, read from the environment by
// ConfigFromEnv.
type Config struct {
	// DatabaseURL is DATABASE_URL; empty starts a throwaway PostgreSQL
	// from local server binaries.
	DatabaseURL string
	// Addr is ADDR, the listen address. Defaults to 127.0.0.1:8080.
	Addr string
	// StripeAPIBase is STRIPE_API_BASE; empty starts an in-process fake.
	StripeAPIBase string
	// LockTimeout is LOCK_TIMEOUT. Defaults to 90s.
	LockTimeout time.Duration
	// FaultHeader is ATOMICPHASE_FAULT_HEADER=1: honour the
	// Atomicphase-Fault request header (a test hook for the demo).
	FaultHeader bool
}

// ConfigFromEnv reads Config from the environment.
func ConfigFromEnv() (Config, error) {
	cfg := Config{
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		Addr:          os.Getenv("ADDR"),
		StripeAPIBase: strings.TrimRight(os.Getenv("STRIPE_API_BASE"), "/"),
		LockTimeout:   atomicphase.DefaultLockTimeout,
		FaultHeader:   os.Getenv("ATOMICPHASE_FAULT_HEADER") == "1",
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8080"
	}
	if v := os.Getenv("LOCK_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("LOCK_TIMEOUT=%q: want a positive Go duration such as 90s", v)
		}
		cfg.LockTimeout = d
	}
	return cfg, nil
}

// Run starts the server and serves until ctx ends. Progress goes to logw.
func Run(ctx context.Context, cfg Config, logw io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "rocketrides: "+format+"\n", args...) }
	faults, err := faultinject.FromEnv() // a malformed ATOMICPHASE_FAULTS stops start-up here
	if err != nil {
		return err
	}

	if cfg.DatabaseURL == "" {
		srv, err := pgtemp.Start(ctx)
		if err != nil {
			return noDatabaseError(err)
		}
		defer srv.Stop()
		logf("DATABASE_URL is empty: started a throwaway PostgreSQL from %s at %s", srv.Bin, pgtemp.Redact(srv.URL))
		cfg.DatabaseURL = srv.URL
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := atomicphase.Migrate(ctx, pool, nil); err != nil {
		return err
	}
	if err := Migrate(ctx, pool); err != nil {
		return fmt.Errorf("rocketrides schema: %w", err)
	}

	if cfg.StripeAPIBase == "" {
		fake, err := fakestripe.Start()
		if err != nil {
			return err
		}
		defer fake.Close()
		cfg.StripeAPIBase = fake.URL
		logf("STRIPE_API_BASE is empty: using the in-process fake payment API at %s", fake.URL)
	}

	if faults != nil {
		faults.Admin = pool
		logf("fault injection from %s is on", faultinject.EnvVar)
	}
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{
		LockTimeout:   cfg.LockTimeout,
		FaultInjector: &faultinject.ContextInjector{Base: faults},
		Logger:        slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	handler := Handler(runner, pool, NewWorkflow(cfg.StripeAPIBase), logf)
	if cfg.FaultHeader {
		handler = faultinject.HeaderMiddleware(pool, handler)
		logf("ATOMICPHASE_FAULT_HEADER=1: honouring the %s request header (test hook)", faultinject.FaultHeader)
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logf("listening on http://%s", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// noDatabaseError explains what to do when DATABASE_URL is empty and no
// throwaway PostgreSQL could be started. The server links no Docker client
// (a production binary should not), so unlike the test harness it cannot
// fall back to a container.
func noDatabaseError(err error) error {
	return fmt.Errorf("DATABASE_URL is empty and no throwaway PostgreSQL could be started (%w). Either\n"+
		"  1. set DATABASE_URL to a PostgreSQL server, or\n"+
		"  2. install the PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin\n"+
		"     (Debian/Ubuntu: apt-get install postgresql), or\n"+
		"  3. run `make demo`, or the tests, whose harness can also start PostgreSQL in Docker", err)
}

// Handler routes GET /healthz and POST /rides.
func Handler(runner *atomicphase.Runner, pool *pgxpool.Pool, wf *atomicphase.Workflow[Ride], logf func(string, ...any)) http.Handler {
	idempotent := aphttp.Middleware(runner, wf, &aphttp.Options{
		Scope: func(r *http.Request) (string, error) { return authenticate(r, pool) },
		OnError: func(r *http.Request, err error) {
			logf("%s %s key %q: %v", r.Method, r.URL.Path, r.Header.Get(aphttp.HeaderName), err)
		},
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := pool.Ping(r.Context()); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/rides", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		aphttp.WriteProblem(w, aphttp.Problem{Type: "about:blank", Title: "Method Not Allowed", Status: http.StatusMethodNotAllowed}, 0)
	})))
	return mux
}

// errUnauthorized is what a missing or unknown bearer token gets: 401.
var errUnauthorized = fmt.Errorf("%w: send Authorization: Bearer <email> of a known user", aphttp.ErrUnauthorized)

// authenticate maps the bearer token (the user's email) to the scope. A
// database error is not a 401: the client must retry, not give up.
func authenticate(r *http.Request, pool *pgxpool.Pool) (string, error) {
	email, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || email == "" || !utf8.ValidString(email) || strings.ContainsRune(email, 0) {
		// No user has such an email; asking the database would only earn
		// a data error, which is no reason to answer 503.
		return "", errUnauthorized
	}
	var exists bool
	err := pool.QueryRow(r.Context(), `SELECT EXISTS (SELECT FROM users WHERE email = $1)`, email).Scan(&exists)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("cannot check the user now: %w", err)
	}
	if !exists {
		return "", errUnauthorized
	}
	return email, nil
}
