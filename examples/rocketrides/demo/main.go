// Command demo shows Rocket Rides surviving crashes: it starts a throwaway
// PostgreSQL, the example server (as a real process), a fake payment API and
// a fake mailer, then books a stream of rides while injecting a fault into
// every request — crashes, errors, panics, killed database backends, lost
// commit acknowledgements at every fault point, and real SIGKILLs of the
// server, which it restarts — retrying each request with its key as a
// well-behaved client does. One more request is killed mid-way and never
// retried: the server's sweep finishes it. It ends with the invariants
// counted at the database, the payment API and the mailer, and exits
// non-zero if any failed.
//
//	go run ./examples/rocketrides/demo
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/app"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
	"github.com/atomicphase/atomicphase/faultinject"
)

const (
	serveEnv      = "ROCKETRIDES_DEMO_SERVE"
	user          = "user@example.com"
	rideBody      = `{"origin_lat": 37.77, "origin_lon": -122.42, "target_lat": 37.80, "target_lon": -122.27}`
	lockTimeout   = time.Second
	sweepInterval = 500 * time.Millisecond
	// abandonFault kills the server after the charge; that client gives up.
	abandonFault = "charge:after-foreign:exit"
)

func main() {
	if os.Getenv(serveEnv) == "1" { // the server process the demo starts
		cfg, err := app.ConfigFromEnv()
		if err == nil {
			err = app.Run(context.Background(), cfg, os.Stderr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	requests := flag.Int("requests", 40, "how many rides to book")
	workers := flag.Int("clients", 4, "how many clients book at once")
	hold := flag.Bool("hold", false, "after the tally, keep the server and its operator console up until interrupted")
	flag.Parse()
	if err := run(*requests, *workers, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// combos is every fault point with every action that applies there:
// terminate-backend where the attempt holds a connection, lose-commit-ack
// where a commit follows.
var combos = func() []string {
	var out []string
	for _, p := range app.FaultPoints {
		hasConn := strings.Contains(p, "before-commit") || strings.Contains(p, "after-commit") ||
			strings.Contains(p, "before-response") || strings.HasPrefix(p, "create_ride:before-phase") ||
			strings.HasPrefix(p, "send_receipt:before-phase")
		for _, a := range []faultinject.Action{faultinject.Crash, faultinject.Error, faultinject.Panic,
			faultinject.TerminateBackend, faultinject.LoseCommitAck} {
			if (a == faultinject.TerminateBackend && !hasConn) || (a == faultinject.LoseCommitAck && !strings.HasSuffix(p, "before-commit")) {
				continue
			}
			out = append(out, p+":"+string(a))
		}
	}
	return out
}()

// plan gives request i its fault: the combos in turn, and a real SIGKILL
// of the server now and then.
func plan(i int) string {
	if i%13 == 6 { // a real process kill, at a point that matters most
		return []string{"charge:after-foreign:exit", "payout:after-foreign:exit", "send_receipt:before-commit:exit", "create_ride:after-commit:exit"}[(i/13)%4]
	}
	return combos[(i*7)%len(combos)] // a stride, so neighbours differ
}

func run(requests, workers int, hold bool) error {
	start := time.Now()
	ctx := context.Background()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		srv, err := atomicphasetest.StartServer(ctx, func(f string, a ...any) { fmt.Printf("· "+f+"\n", a...) })
		if err != nil {
			return err
		}
		defer srv.Stop()
		dbURL = srv.URL
	}
	cfg, err := connstr.Parse(dbURL)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	pay, err := fakestripe.Start()
	if err != nil {
		return err
	}
	defer pay.Close()
	bank, err := fakebank.Start(nil)
	if err != nil {
		return err
	}
	defer bank.Close()
	mailer, err := fakemailer.Start(nil)
	if err != nil {
		return err
	}
	defer mailer.Close()
	fmt.Printf("· fake payment API at %s, fake bank at %s, fake mailer at %s\n", pay.URL, bank.URL, mailer.URL)

	srv, err := newSupervisor(dbURL, pay.URL, bank.URL, mailer.URL)
	if err != nil {
		return err
	}
	defer srv.stop()
	fmt.Printf("· rocketrides server at %s (LOCK_TIMEOUT=%s, SWEEP_INTERVAL=%s), booking %d rides with %d clients,\n"+
		"  and one more whose client gives up when the server dies under it\n", srv.url, lockTimeout, sweepInterval, requests, workers)
	fmt.Printf("· operator console at http://%s/ (the levels, every key, its phases and audit trail; up while the demo runs, or with -hold after it)\n\n", srv.consoleAddr)

	runID := time.Now().Format("150405")
	var printMu sync.Mutex
	printf := func(format string, args ...any) {
		printMu.Lock()
		defer printMu.Unlock()
		fmt.Printf(format, args...)
	}

	abandoned := fmt.Sprintf("demo-%s-gave-up", runID)
	sweptIn, err := giveUp(ctx, srv.url, pool, abandoned, printf)
	if err != nil {
		return err
	}

	// The operator: an injected panic is a bug, which parks the key; the
	// client's retries are answered "parked" until someone unparks it. The
	// demo's bug is "fixed" at once, and the demo unparks the key as an
	// operator would (atomicphase unpark SCOPE KEY).
	operator, err := atomicphase.NewRunner(pool, nil)
	if err != nil {
		return err
	}
	unpark := func(key string) error {
		printf("  ⚑ %s parked by its panic; the operator unparks it\n", key)
		return operator.Unpark(ctx, user, key)
	}

	finals := make([]reply, requests)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				key := fmt.Sprintf("demo-%s-%02d", runID, i+1)
				fault := plan(i)
				final, attempts := book(srv.url, key, fault, unpark)
				finals[i] = final
				printf("%-20s fault %-38s attempts %-2d → %s\n", key, fault, attempts, describe(final))
			}
		}()
	}
	for i := range requests {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	_, swept := <-sweptIn

	// Every key with a final answer must replay it byte for byte.
	replayed := 0
	for i := range requests {
		key := fmt.Sprintf("demo-%s-%02d", runID, i+1)
		r, err := post(srv.url, key, "")
		if err == nil && r.status == finals[i].status && bytes.Equal(r.body, finals[i].body) && r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	var rides, charged int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(stripe_charge_id) FROM rides WHERE idempotency_key LIKE $1`,
		"demo-"+runID+"-%").Scan(&rides, &charged); err != nil {
		return err
	}
	charges := pay.Charges()
	ok201 := 0
	for _, f := range finals {
		if f.status == http.StatusCreated {
			ok201++
		}
	}
	receipts, onePerRide := awaitReceipts(mailer, charged)
	total := requests + 1 // the abandoned one too
	duplicates := len(charges) - charged
	lost := requests - ok201
	if !swept {
		lost++
	}
	payouts := len(bank.Payouts())
	doublePaid := 0
	for _, n := range bank.PerReference() {
		doublePaid += n - 1
	}
	fmt.Printf("\n%d requests · %d rides · %d charges · %d duplicate charges · %d payouts · %d duplicate payouts · %d lost · %d replays byte-identical · %d receipts · %d finished by the sweep · %d server kills · %.1fs\n",
		total, rides, len(charges), duplicates, payouts, doublePaid, lost, replayed, receipts, btoi(swept), srv.kills(), time.Since(start).Seconds())
	if rides != total || len(charges) != total || duplicates != 0 || payouts != total || doublePaid != 0 || lost != 0 || replayed != requests || receipts != total || !onePerRide {
		return errors.New("an invariant failed: see the counts above")
	}
	fmt.Println("every invariant held: one ride, one charge, one payout and one receipt per key, every answer replayed byte for byte")
	if hold {
		fmt.Printf("· holding: the operator console is at http://%s/; interrupt (Ctrl-C) to stop\n", srv.consoleAddr)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		<-ctx.Done()
	}
	return nil
}

// giveUp sends key's request once, with a fault that kills the server
// under it, and never retries: the server's sweep, not the client, is to
// finish it. The channel yields how long after the crash it was finished,
// or closes if it was not within half a minute.
func giveUp(ctx context.Context, url string, pool *pgxpool.Pool, key string, printf func(string, ...any)) (<-chan time.Duration, error) {
	if r, err := post(url, key, abandonFault); err == nil {
		return nil, fmt.Errorf("the server answered a request it was to die in: %d %s", r.status, r.body)
	}
	crashed := time.Now()
	printf("%-20s fault %-38s attempts 1  → no answer; the client gives up\n", key, abandonFault)
	sweptIn := make(chan time.Duration, 1)
	go func() {
		defer close(sweptIn)
		for range 600 {
			var status *int
			err := pool.QueryRow(ctx, "SELECT response_status FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2",
				user, key).Scan(&status)
			if err == nil && status != nil {
				took := time.Since(crashed)
				printf("%-20s ↻ finished by the server's sweep %.1fs after its client gave up → %d\n", key, took.Seconds(), *status)
				sweptIn <- took
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return sweptIn, nil
}

// awaitReceipts gives the receipts the contract's 10 seconds to reach the
// mailer (a delivery cut short by a kill is rescued after a few) and counts
// them, and whether each is for a distinct ride.
func awaitReceipts(mailer *fakemailer.Server, want int) (int, bool) {
	deadline := time.Now().Add(10 * time.Second)
	for len(mailer.Receipts()) < want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	receipts := mailer.Receipts()
	rides := map[int64]bool{}
	for _, r := range receipts {
		rides[r.RideID] = true
	}
	return len(receipts), len(rides) == len(receipts)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// book sends the request with its fault on the first attempt, then retries
// like a well-behaved client until it gets a final answer; a key answered
// "parked" is unparked (by the operator) before the next retry.
func book(url, key, fault string, unpark func(key string) error) (reply, int) {
	for attempt := 1; ; attempt++ {
		f := ""
		if attempt == 1 {
			f = fault
		}
		r, err := post(url, key, f)
		switch {
		case err == nil && r.status == http.StatusInternalServerError && bytes.Contains(r.body, []byte(aphttp.ProblemParked)):
			if err := unpark(key); err != nil {
				return reply{status: 0, body: []byte("unpark: " + err.Error())}, attempt
			}
		case err != nil || r.status >= 500:
			time.Sleep(150 * time.Millisecond)
		case r.status == http.StatusConflict:
			time.Sleep(250 * time.Millisecond) // Retry-After says 1s; a demo is impatient
		default:
			return r, attempt
		}
		if attempt == 200 {
			return reply{status: 0, body: []byte("gave up")}, attempt
		}
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(url, key, fault string) (reply, error) {
	req, err := http.NewRequest("POST", url+"/rides", strings.NewReader(rideBody))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+user)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	if fault != "" {
		req.Header.Set(faultinject.FaultHeader, "create_ride/"+fault)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, body}, err
}

func describe(r reply) string {
	var out struct {
		RideID   int64  `json:"ride_id"`
		ChargeID string `json:"charge_id"`
	}
	if r.status == http.StatusCreated && json.Unmarshal(r.body, &out) == nil {
		return fmt.Sprintf("%d ride %d, %s", r.status, out.RideID, out.ChargeID)
	}
	return fmt.Sprintf("%d %s", r.status, r.body)
}

// supervisor runs the server as a child process on a fixed address and
// restarts it whenever it dies.
type supervisor struct {
	url, addr, consoleAddr, dbURL, payURL, bankURL, mailURL string
	log                                                     *os.File

	mu      sync.Mutex
	cmd     *exec.Cmd
	killed  int
	stopped bool
}

// freeAddr returns a loopback address with a port free now: the server's
// incarnations all listen there, so that its URL (and its console's) holds
// across restarts.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func newSupervisor(dbURL, payURL, bankURL, mailURL string) (*supervisor, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	consoleAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.CreateTemp("", "rocketrides-demo-*.log")
	if err != nil {
		return nil, err
	}
	s := &supervisor{url: "http://" + addr, addr: addr, consoleAddr: consoleAddr, dbURL: dbURL, payURL: payURL, bankURL: bankURL, mailURL: mailURL, log: log}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *supervisor) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), serveEnv+"=1", "DATABASE_URL="+s.dbURL, "ADDR="+s.addr,
		"STRIPE_API_BASE="+s.payURL, "BANK_API_BASE="+s.bankURL, "MAILER_API_BASE="+s.mailURL, "LOCK_TIMEOUT="+lockTimeout.String(),
		"SWEEP_INTERVAL="+sweepInterval.String(), "KEY_RETENTION=24h", "ATOMICPHASE_FAULT_HEADER=1", faultinject.EnvVar+"=",
		// The demo's bank acts before it answers, so a payout whose answer
		// was lost is over once its lease ends: a short grace after it.
		"CALL_GRACE=100ms",
		"CONSOLE_ADDR="+s.consoleAddr)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	for range 400 {
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				go s.watch(cmd)
				return nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("the server did not start; its log is %s", s.log.Name())
}

// watch restarts the server when it dies.
func (s *supervisor) watch(cmd *exec.Cmd) {
	_ = cmd.Wait()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.killed++
	s.mu.Unlock()
	how := cmd.ProcessState.String()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signal() == syscall.SIGKILL {
		how = "killed by SIGKILL"
	}
	fmt.Printf("  ✝ server %s; restarting it against the same database\n", how)
	if err := s.start(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func (s *supervisor) kills() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopped = true
	cmd := s.cmd
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
	}
	s.log.Close()
	os.Remove(s.log.Name())
}
