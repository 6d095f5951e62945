package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/app"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
)

var binary string // the example, built once by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rocketrides-e2e-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "rocketrides")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the example: %v\n%s", err, out)
		os.Exit(1)
	}
	code := atomicphasetest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	rideBody    = `{"origin_lat": 37.77, "origin_lon": -122.42, "target_lat": 37.80, "target_lon": -122.27}`
	lockTimeout = "1s"
)

// server is the example running as a real process.
type server struct {
	cmd    *exec.Cmd
	url    string
	log    *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer starts the example against dbURL with LOCK_TIMEOUT=1s and
// no faults, env (NAME=value items) added or overriding, and waits until it
// is healthy. The port is chosen free, then bound by the server a moment
// later: when another process took it meanwhile, the start is tried again
// on another.
func startServer(t *testing.T, dbURL string, env ...string) *server {
	t.Helper()
	for try := 0; ; try++ {
		s, bindErr := tryStartServer(t, dbURL, env...)
		if s != nil {
			return s
		}
		if try == 2 {
			t.Fatalf("the server found its port taken three times:\n%s", bindErr)
		}
	}
}

// tryStartServer is one try of startServer: nil and the server's log when
// the port it was given was taken before it bound it.
func tryStartServer(t *testing.T, dbURL string, env ...string) (*server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s := &server{url: "http://" + addr, log: &syncBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(binary)
	s.cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "ADDR="+addr, "LOCK_TIMEOUT="+lockTimeout,
		// The fake bank acts before it answers (unless told to be slow):
		// once a call returned, nothing of it is in flight.
		"CALL_GRACE=1ms", "ATOMICPHASE_FAULTS=")
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			t.Logf("the server's log:\n%s", s.log)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			if log := s.log.String(); strings.Contains(log, "address already in use") {
				return nil, log
			}
			t.Fatalf("the server exited during start-up:\n%s", s.log)
		default:
		}
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.Contains(s.log.String(), "listening on http://"+addr) {
				return s, ""
			}
		}
		select {
		case <-s.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("the server did not become healthy:\n%s", s.log)
	return nil, ""
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(url, user, key, body string) (reply, error) {
	req, err := http.NewRequest("POST", url+"/rides", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+user)
	req.Header.Set("Idempotency-Key", key)
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, data}, err
}

// retryUntilFinal is a well-behaved client: it retries connection errors,
// 409 (after Retry-After) and 5xx with the same key until another answer.
func retryUntilFinal(t *testing.T, url, user, key, body string) reply {
	t.Helper()
	for range 100 {
		r, err := post(url, user, key, body)
		switch {
		case err != nil || r.status >= 500:
			time.Sleep(100 * time.Millisecond)
		case r.status == http.StatusConflict:
			secs, _ := strconv.Atoi(r.header.Get("Retry-After"))
			require.Positive(t, secs, "409 carries Retry-After in whole seconds")
			time.Sleep(200 * time.Millisecond) // shorter than asked, to keep the test quick
		default:
			return r
		}
	}
	t.Fatal("no final answer after 100 attempts")
	return reply{}
}

func count(t *testing.T, db *atomicphasetest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// dbOptions gives each test a database with the example's schema, River's
// and the seeds. With bouncerEnv set, the example and the test reach it
// through a real PgBouncer in transaction pooling mode, in the exec mode
// atomicphasetest.ExecModeEnv names (exec when unset): make
// test/rocketrides-pgbouncer.
var dbOptions = &atomicphasetest.Options{SetupID: app.SchemaID(), Setup: app.Migrate,
	PgBouncer: os.Getenv(bouncerEnv) != ""}

// bouncerEnv, set, runs the end-to-end suite through PgBouncer.
const bouncerEnv = "ROCKETRIDES_E2E_PGBOUNCER"

// world is what a server under test talks to: its own database, a fake
// payment API, a fake bank and a fake mailer, each the test's own.
type world struct {
	db     *atomicphasetest.DB
	pay    *fakestripe.Server
	bank   *fakebank.Server
	mailer *fakemailer.Server
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{db: atomicphasetest.NewDB(t, dbOptions)}
	var err error
	w.pay, err = fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.pay.Close() })
	w.bank, err = fakebank.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.bank.Close() })
	w.mailer, err = fakemailer.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.mailer.Close() })
	return w
}

// start starts the example against the world, env added (see startServer).
func (w *world) start(t *testing.T, env ...string) *server {
	t.Helper()
	return startServer(t, w.db.URL, append([]string{"STRIPE_API_BASE=" + w.pay.URL, "BANK_API_BASE=" + w.bank.URL, "MAILER_API_BASE=" + w.mailer.URL}, env...)...)
}

// waitReceipts waits up to the contract's 10 seconds for the mailer to
// hold n receipts, and returns them.
func (w *world) waitReceipts(t *testing.T, n int) []fakemailer.Receipt {
	t.Helper()
	require.Eventually(t, func() bool { return len(w.mailer.Receipts()) >= n }, time.Minute, 20*time.Millisecond,
		"want %d receipts at the mailer, have %d", n, len(w.mailer.Receipts()))
	return w.mailer.Receipts()
}

type booked struct {
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
	PayoutID string `json:"payout_id"`
}

// requireOnePayout checks invariant 4 at the bank for the one ride a test
// booked: exactly one payout, the one its 201 names and its row records.
func (w *world) requireOnePayout(t *testing.T, ride booked) {
	t.Helper()
	payouts := w.bank.Payouts()
	require.Len(t, payouts, 1, "exactly one payout at the bank")
	require.Equal(t, payouts[0].ID, ride.PayoutID)
	require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides WHERE id = $1 AND bank_payout_id = $2", ride.RideID, ride.PayoutID))
}

func decodeBooked(t *testing.T, r reply) booked {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var b booked
	require.NoError(t, json.Unmarshal(r.body, &b))
	return b
}

// TestKillAtEveryFaultPoint SIGKILLs the server at each fault point while
// it serves a ride, restarts it against the same database, retries the
// request to a final answer, and checks the invariants of README.md against
// the payment API's distinct charges, the bank's payouts and the mailer's
// distinct receipts.
func TestKillAtEveryFaultPoint(t *testing.T) {
	t.Parallel()
	for _, point := range app.FaultPoints {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			const user, key = "user@example.com", "ride-under-fire"

			doomed := w.start(t, "ATOMICPHASE_FAULTS=create_ride/"+point+":exit")
			_, err := post(doomed.url, user, key, rideBody)
			require.Error(t, err, "the server died mid-request")
			<-doomed.exited
			ws, ok := doomed.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed by SIGKILL: %v\n%s", doomed.cmd.ProcessState, doomed.log)

			restarted := w.start(t)
			final := retryUntilFinal(t, restarted.url, user, key, rideBody)
			ride := decodeBooked(t, final)

			// Invariant 1 and 2: exactly one ride and one distinct charge.
			require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides WHERE idempotency_key = $1", key))
			require.Len(t, w.pay.Charges(), 1, "exactly one distinct charge at the payment API")
			require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides WHERE stripe_charge_id = $1", w.pay.Charges()[0].ID))
			// Invariant 3: every later retry gets the answer byte for byte.
			again, err := post(restarted.url, user, key, rideBody)
			require.NoError(t, err)
			require.Equal(t, final.status, again.status)
			require.Equal(t, final.body, again.body)
			require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			// Invariant 4: exactly one payout and one receipt, for this ride.
			w.requireOnePayout(t, ride)
			receipts := w.waitReceipts(t, 1)
			require.Len(t, receipts, 1)
			require.Equal(t, ride.RideID, receipts[0].RideID)
			require.Equal(t, ride.ChargeID, receipts[0].ChargeID)
			queued, err := app.QueuedReceipts(context.Background(), w.db.Pool)
			require.NoError(t, err)
			require.Equal(t, 1, queued)
		})
	}
}

// TestConcurrentClientsAcrossAKill: clients hammer one key while the server
// is killed after the charge and restarted; all converge on one answer, one
// ride, one charge, one payout, one receipt.
func TestConcurrentClientsAcrossAKill(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	doomed := w.start(t, "ATOMICPHASE_FAULTS=create_ride/charge:after-foreign:exit")

	var mu sync.Mutex
	url := doomed.url
	current := func() string { mu.Lock(); defer mu.Unlock(); return url }
	answers := make([]reply, 8)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				r, err := post(current(), "user@example.com", "hammered", rideBody)
				if err == nil && r.status != 409 && r.status < 500 {
					answers[i] = r
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	<-doomed.exited
	restarted := w.start(t)
	mu.Lock()
	url = restarted.url
	mu.Unlock()
	wg.Wait()
	for _, a := range answers {
		require.Equal(t, 201, a.status)
		require.Equal(t, answers[0].body, a.body)
	}
	require.Len(t, w.pay.Charges(), 1)
	require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides"))
	w.requireOnePayout(t, decodeBooked(t, answers[0]))
	require.Len(t, w.waitReceipts(t, 1), 1)
}

func TestMalformedFaultsStopStartUp(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), "ATOMICPHASE_FAULTS=charge:whenever:exit", "DATABASE_URL=postgres://unused")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "%v", err)
	require.Contains(t, string(out), "ATOMICPHASE_FAULTS")
	require.Contains(t, string(out), `unknown place "whenever"`)
}

// TestServerLinksNoTestMachinery: the server binary links neither testing
// nor a Docker client; only its tests and the demo use the harness.
func TestServerLinksNoTestMachinery(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		bad := dep == "testing" || strings.Contains(dep, "dockertest") || strings.Contains(dep, "docker/") ||
			strings.Contains(dep, "stretchr/testify") || strings.HasSuffix(dep, "/atomicphasetest")
		require.False(t, bad, "the server links %s", dep)
	}
}
