// Package app is the Rocket Rides example server: POST /rides books a ride,
// charges the rider's card, pays the driver and queues the receipt, safely retryable with an
// Idempotency-Key, on atomicphase; River delivers the receipts and the
// sweep finishes what clients gave up. examples/rocketrides/README.md
// describes its behaviour: start-up, environment, answers, the calls it
// makes and the invariants.
package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apcitus"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// Run starts the server and serves until ctx ends, then stops in order:
// the listener (requests in flight finish), the sweep, the receipt
// deliveries, the fakes, the database. Progress goes to logw.
func Run(ctx context.Context, cfg Config, logw io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "rocketrides: "+format+"\n", args...) }
	logger := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn}))
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
		logf("DATABASE_URL is empty: started a throwaway PostgreSQL from %s at %s", srv.Bin, connstr.Display(srv.URL))
		cfg.DatabaseURL = srv.URL
	}
	pool, err := newPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// On a Citus coordinator the key table and its functions are
	// distributed, and Migrate below distributes the example's tables
	// with them (docs/scale.md).
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	citus, err := OnCitus(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return err
	}
	if _, err := atomicphase.Migrate(ctx, pool, &atomicphase.MigrateOpts{Citus: citus}); err != nil {
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
	if cfg.MailerAPIBase == "" {
		fake, err := fakemailer.Start(func(r fakemailer.Receipt) {
			logf("fake mailer: %s, the receipt for ride %d (%s) to %s", r.ID, r.RideID, r.ChargeID, r.To)
		})
		if err != nil {
			return err
		}
		defer fake.Close()
		cfg.MailerAPIBase = fake.URL
		logf("MAILER_API_BASE is empty: using the in-process fake mailer at %s", fake.URL)
	}
	if cfg.BankAPIBase == "" {
		fake, err := fakebank.Start(func(p fakebank.Payout) {
			logf("fake bank: %s, %d %s to %s (reference %s)", p.ID, p.Amount, p.Currency, p.Account, p.Reference)
		})
		if err != nil {
			return err
		}
		defer fake.Close()
		cfg.BankAPIBase = fake.URL
		logf("BANK_API_BASE is empty: using the in-process fake bank API at %s", fake.URL)
	}

	receipts, err := StartReceipts(pool, cfg.MailerAPIBase, logger, logf)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := receipts.Stop(sctx); err != nil {
			logf("stopping receipt deliveries: %v", err)
		}
	}()

	if faults != nil {
		faults.Admin = pool
		logf("fault injection from %s is on", faultinject.EnvVar)
	}
	var router atomicphase.Router
	if cfg.CitusRoute {
		if !citus {
			return errors.New("CITUS_ROUTE=1 needs a Citus coordinator at DATABASE_URL (docs/scale.md)")
		}
		r, err := apcitus.NewRouter(ctx, pool, &apcitus.Config{OnRefreshError: func(err error) { logf("refreshing the shard map: %v", err) }})
		if err != nil {
			return err
		}
		defer r.Close()
		router = r
		logf("CITUS_ROUTE=1: each rider's requests go to its worker (%d workers)", len(r.Nodes()))
	}
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{
		Router:        router,
		LockTimeout:   cfg.LockTimeout,
		CallGrace:     cfg.CallGrace,
		FaultInjector: &faultinject.ContextInjector{Base: faults},
		Logger:        logger,
		Observer:      sweepLog(logf),
		RedactKey:     RedactKey,
	})
	if err != nil {
		return err
	}
	wf := NewWorkflow(cfg.StripeAPIBase, cfg.BankAPIBase, receipts)
	// The sweep resumes their keys before any request. Each key resumes
	// under the definition of the version it started under: a v2 server
	// runs v1's too, for the keys v1 servers started.
	if err := runner.Register(wf); err != nil {
		return err
	}
	if cfg.Release == "v2" {
		wf = NewWorkflowV2(cfg.StripeAPIBase, cfg.BankAPIBase, receipts, nil)
		if err := runner.Register(wf); err != nil {
			return err
		}
	}
	logf("serving create_ride %s (version %s)", cfg.Release, wf.Version())
	if cfg.SweepInterval > 0 {
		stop, err := startSweep(runner, cfg.SweepInterval, cfg.KeyRetention)
		if err != nil {
			return err
		}
		defer stop()
		logf("sweeping every %s: abandoned keys are finished, finished keys kept %s", cfg.SweepInterval, cfg.KeyRetention)
	} else {
		logf("SWEEP_INTERVAL=0: no sweep; abandoned keys wait for their clients, finished keys are kept")
	}

	handler := Handler(runner, pool, wf, logf)
	if cfg.FaultHeader {
		handler = faultinject.HeaderMiddleware(pool, handler)
		logf("ATOMICPHASE_FAULT_HEADER=1: honouring the %s request header (test hook)", faultinject.FaultHeader)
	}

	if cfg.ConsoleAddr != "" {
		_, stop, err := serveConsole(runner, cfg.ConsoleAddr, logf)
		if err != nil {
			return err
		}
		defer stop()
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

// newPool connects to url with room for River (which keeps a connection
// for LISTEN) beside the requests and the sweep, unless url sets
// pool_max_conns itself.
func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := connstr.Parse(url)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, 16)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// startSweep runs the sweep in the background until the returned function
// is called, which waits for the sweep in progress to stop (a key it was
// resuming rolls back its phase and is unlocked).
func startSweep(runner *atomicphase.Runner, interval, retention time.Duration) (func(), error) {
	sweeper, err := atomicphase.NewSweeper(runner, &atomicphase.SweepConfig{Interval: interval, Retention: retention})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sweeper.Run(ctx) // returns nil when ctx ends; failed sweeps are logged
	}()
	return func() { cancel(); <-done }, nil
}

// sweepLog reports on the server's log what the sweep did, and how unknown
// outcomes (a payout whose answer was lost) are reconciled, by the sweep or
// a retry.
func sweepLog(logf func(string, ...any)) atomicphase.Observer {
	return atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		switch e.Kind {
		case atomicphase.EventZombieKey:
			logf("sweep: finished key %q of %s, whose client gave up", e.Key, e.Scope)
		case atomicphase.EventTTLPruned:
			logf("sweep: deleted %d finished key(s) past KEY_RETENTION", e.Count)
		case atomicphase.EventUnknown:
			logf("key %q of %s: the outcome of %s is unknown (%v); it is reconciled before any new call", e.Key, e.Scope, e.Phase, e.Err)
		case atomicphase.EventReconcileHappened:
			logf("key %q of %s: reconciled %s: it took effect, recorded", e.Key, e.Scope, e.Phase)
		case atomicphase.EventReconcileNotHappened:
			logf("key %q of %s: reconciled %s: it did not take effect, making it", e.Key, e.Scope, e.Phase)
		case atomicphase.EventReconcileFailed:
			logf("key %q of %s: cannot reconcile %s yet: %v", e.Key, e.Scope, e.Phase, e.Err)
		case atomicphase.EventParked:
			logf("key %q of %s parked for an operator: %v", e.Key, e.Scope, e.Err)
		}
	})
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
			_, key := RedactKey("", r.Header.Get(aphttp.HeaderName))
			logf("%s %s key %q: %v", r.Method, r.URL.Path, key, err)
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
	err := pool.QueryRow(r.Context(), `SELECT EXISTS (SELECT 1 FROM users WHERE email = $1)`, email).Scan(&exists)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("cannot check the user now: %w", err)
	}
	if !exists {
		return "", errUnauthorized
	}
	return email, nil
}

// RedactKey is the Runner's Config.RedactKey: a rider's e-mail (the scope)
// and a client's idempotency key are the users' data, so the log and the
// metrics name them by a short hash, the same for every line about them.
func RedactKey(scope, key string) (string, string) {
	return redacted("rider", scope), redacted("key", key)
}

func redacted(kind, s string) string {
	if s == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("rocketrides-log\x00" + kind + "\x00" + s))
	return kind + "-" + hex.EncodeToString(sum[:6])
}
