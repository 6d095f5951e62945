package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

// TestClientBooksEachRideOnceUnderFaults: clients book rides through
// aphttp.Client alone, one Do per ride and no retry of their own, while
// the server is killed at the fault points that matter most and restarted,
// a proxy in front of it drops answers the server sent, and its PostgreSQL
// goes away (every connection broken, new ones refused) and comes back.
// Every ride is booked exactly once: one ride row per key, one charge, one
// payout, one receipt, and each client's answer is its ride's 201.
func TestClientBooksEachRideOnceUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("clients under faults at every point, against real servers; make test-all runs it")
	}
	t.Parallel()
	w := newWorld(t)
	backend, dbURL := dbThroughProxy(t, w.db.URL)
	pg := startProxy(t, backend, 0)
	front := startProxy(t, "", 4)
	start := func(fault string) *server {
		t.Helper()
		env := []string{"STRIPE_API_BASE=" + w.pay.URL, "BANK_API_BASE=" + w.bank.URL, "MAILER_API_BASE=" + w.mailer.URL, "ATOMICPHASE_FAULTS=" + fault}
		if fault != "" {
			// The fault is for a client's ride: a sweep taking over the
			// ride the last kill left could reach it before the server is
			// seen up (the clients finish that ride themselves).
			env = append(env, "SWEEP_INTERVAL=0")
		}
		s := startServer(t, dbURL(pg.addr), env...)
		front.setBackend(strings.TrimPrefix(s.url, "http://"))
		return s
	}

	// The clients: each books rides one after another until told to stop.
	var retries atomic.Int32
	client := aphttp.NewClient(&aphttp.ClientOptions{
		// A connection per attempt: the proxy drops every fourth answer.
		HTTPClient: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		Timeout:    3 * time.Minute,
		OnRetry:    func(int, time.Duration, error) { retries.Add(1) },
	})
	type booking struct {
		resp *aphttp.Response
		body []byte
		err  error
	}
	var mu sync.Mutex
	var bookings []booking
	done := func() int { mu.Lock(); defer mu.Unlock(); return len(bookings) }
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for range 4 {
		clients.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, "http://"+front.addr+"/rides", strings.NewReader(rideBody)) // a constant, valid URL
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer user@example.com")
				resp, err := client.Do(req) // no key: the client makes one
				b := booking{resp: resp, err: err}
				if err == nil {
					b.body, b.err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				bookings = append(bookings, b)
				mu.Unlock()
			}
		})
	}
	progress := func(n int, what string, logs ...*server) {
		t.Helper()
		from := done()
		require.Eventually(t, func() bool { return done() >= from+n }, 3*time.Minute, 20*time.Millisecond,
			"%s: %d rides booked, waiting for %d more; server logs:\n%s", what, done(), n, logsOf(logs))
	}

	// Kills: each server dies by SIGKILL at its fault point, under a ride
	// in flight; the next one is started against the same database.
	kills := 0
	for _, fault := range []string{"create_ride/charge:after-foreign:exit", "create_ride/payout:after-foreign:exit",
		"create_ride/create_ride:after-commit:exit", "create_ride/send_receipt:before-commit:exit"} {
		s := start(fault)
		select {
		case <-s.exited:
		case <-time.After(3 * time.Minute):
			t.Fatalf("the server did not reach %s; its log:\n%s", fault, s.log)
		}
		ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed by SIGKILL at %s: %v\n%s", fault, s.cmd.ProcessState, s.log)
		kills++
	}
	s := start("")
	progress(4, "after the kills", s)

	// PostgreSQL goes away until the server notices, and comes back.
	pg.outage()
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, time.Minute, 20*time.Millisecond, "the server's health check never saw the database gone")
	pg.restore()
	progress(8, "after PostgreSQL came back", s)
	close(stop)
	clients.Wait()

	// Every client got its ride's 201, under its own key.
	rides := map[string]booked{}
	replayed := 0
	for _, b := range bookings {
		require.NoError(t, b.err)
		require.Equal(t, http.StatusCreated, b.resp.StatusCode, "%s", b.body)
		ride := decodeBooked(t, reply{status: b.resp.StatusCode, body: b.body})
		h := http.Header{}
		h.Set(aphttp.HeaderName, b.resp.Key)
		key, err := aphttp.ParseKey(h)
		require.NoError(t, err)
		_, dup := rides[key]
		require.False(t, dup, "two bookings with key %s", key)
		rides[key] = ride
		require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides WHERE idempotency_key = $1 AND id = $2", key, ride.RideID),
			"the ride the answer names is the key's")
		if b.resp.Replayed {
			replayed++
		}
	}
	// Exactly once: one ride, charge, payout and receipt per booking.
	require.Equal(t, len(rides), count(t, w.db, "SELECT count(*) FROM rides"), "one ride per booking")
	require.Zero(t, count(t, w.db, "SELECT count(*) FROM (SELECT idempotency_key FROM rides GROUP BY 1 HAVING count(*) > 1) d"), "no key booked twice")
	require.Len(t, w.pay.Charges(), len(rides), "one charge per ride")
	require.Len(t, w.bank.Payouts(), len(rides), "one payout per ride")
	for ref, n := range w.bank.PerReference() {
		require.Equal(t, 1, n, "payouts for reference %s", ref)
	}
	require.Len(t, w.waitReceipts(t, len(rides)), len(rides), "one receipt per ride")

	// The faults happened, and the client retried through them.
	require.Equal(t, 4, kills)
	require.Positive(t, front.dropped.Load(), "answers were dropped")
	require.Positive(t, retries.Load())
	t.Logf("%d rides booked once each through %d kills, %d dropped answers and a PostgreSQL outage; the client retried %d times, %d answers were replays",
		len(rides), kills, front.dropped.Load(), retries.Load(), replayed)
}

// dbThroughProxy returns the database's host:port and a function giving
// the connection string that reaches it at another address, a proxy's.
func dbThroughProxy(t *testing.T, dbURL string) (string, func(addr string) string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	if strings.HasPrefix(cfg.Host, "/") {
		t.Skip("the test database is reached over a Unix socket; the proxy speaks TCP")
	}
	backend := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	return backend, func(addr string) string {
		if u, err := url.Parse(dbURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
			u.Host = addr
			return u.String()
		}
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("%s host=%s port=%s", dbURL, host, port)
	}
}

func logsOf(servers []*server) string {
	var b strings.Builder
	for _, s := range servers {
		b.WriteString(s.log.String())
	}
	return b.String()
}
