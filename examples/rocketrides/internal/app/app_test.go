package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakebank"
	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// dbOptions gives tests a database with the example's schema, River's and
// the seeds.
var dbOptions = &atomicphasetest.Options{
	SetupID:    SchemaID(),
	Setup:      Migrate,
	PoolConfig: func(cfg *pgxpool.Config) { cfg.MaxConns = 16 }, // River keeps one for LISTEN
}

const rideBody = `{"origin_lat": 37.77, "origin_lon": -122.42, "target_lat": 37.80, "target_lon": -122.27}`

type bundle struct {
	db       *atomicphasetest.DB
	fake     *fakestripe.Server
	mailer   *fakemailer.Server
	bank     *fakebank.Server
	receipts *Receipts
	runner   *atomicphase.Runner
	srv      *httptest.Server
}

// setupOpts changes what setup builds; nil means a fake payment API and a
// Runner with the default configuration.
type setupOpts struct {
	// stripeBase is the payment API; "" starts a fake.
	stripeBase string
	// runner configures the Runner (Config.CallGrace defaults to 1ns here).
	runner *atomicphase.Config
}

// setup serves the example in process, as Run does: a database of the
// test's own, the fakes, River delivering receipts, the Runner.
func setup(t *testing.T, opts *setupOpts) *bundle {
	t.Helper()
	if opts == nil {
		opts = &setupOpts{}
	}
	b := &bundle{db: atomicphasetest.NewDB(t, dbOptions)}
	stripeBase := opts.stripeBase
	if stripeBase == "" {
		fake, err := fakestripe.Start()
		require.NoError(t, err)
		t.Cleanup(func() { _ = fake.Close() })
		b.fake, stripeBase = fake, fake.URL
	}
	mailer, err := fakemailer.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mailer.Close() })
	b.mailer = mailer
	b.bank, err = fakebank.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.bank.Close() })

	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b.receipts, err = StartReceipts(b.db.Pool, mailer.URL, logger, t.Logf)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.receipts.Stop(ctx))
	})
	cfg := atomicphase.Config{}
	if opts.runner != nil {
		cfg = *opts.runner
	}
	if cfg.CallGrace == 0 {
		// The fake bank acts before it answers: once a call returned,
		// nothing of it is in flight.
		cfg.CallGrace = time.Nanosecond
	}
	b.runner, err = atomicphase.NewRunner(b.db.Pool, &cfg)
	require.NoError(t, err)
	b.srv = httptest.NewServer(Handler(b.runner, b.db.Pool, NewWorkflow(stripeBase, b.bank.URL, b.receipts), t.Logf))
	t.Cleanup(b.srv.Close)
	return b
}

// testWriter sends River's log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// queuedReceipts counts the receipts queued, in the outbox or as jobs.
func (b *bundle) queuedReceipts(t *testing.T) int {
	t.Helper()
	n, err := QueuedReceipts(context.Background(), b.db.Pool)
	require.NoError(t, err)
	return n
}

// waitReceipts waits up to the contract's 10 seconds for the mailer to
// hold n receipts, and returns them.
func (b *bundle) waitReceipts(t *testing.T, n int) []fakemailer.Receipt {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.mailer.Receipts()) >= n }, time.Minute, 20*time.Millisecond,
		"want %d receipts at the mailer, have %d", n, len(b.mailer.Receipts()))
	return b.mailer.Receipts()
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (b *bundle) post(t *testing.T, user, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest("POST", b.srv.URL+"/rides", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "\x00none" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, data}
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func requireProblem(t *testing.T, r reply, status int) {
	t.Helper()
	require.Equal(t, status, r.status, "%s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(r.body, &p))
	for _, f := range []string{"type", "title", "status"} {
		require.Contains(t, p, f)
	}
	require.EqualValues(t, status, p["status"])
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	resp, err := http.Get(b.srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

func TestRideBookedChargedAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.post(t, "user@example.com", `"ride-1"`, rideBody)
	require.Equal(t, 201, first.status, "%s", first.body)
	var out struct {
		RideID   *float64 `json:"ride_id"`
		ChargeID *string  `json:"charge_id"`
	}
	require.NoError(t, json.Unmarshal(first.body, &out))
	require.NotNil(t, out.RideID)
	require.NotNil(t, out.ChargeID)
	require.True(t, strings.HasPrefix(*out.ChargeID, "ch_"))

	replay := b.post(t, "user@example.com", "ride-1", rideBody) // bare form, same key
	require.Equal(t, 201, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, replay.body)

	require.Len(t, b.fake.Charges(), 1)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides"))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM audit_records WHERE resource_type = 'ride'"))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides WHERE stripe_charge_id = $1", *out.ChargeID))

	receipts := b.waitReceipts(t, 1)
	require.Len(t, receipts, 1)
	require.Equal(t, "user@example.com", receipts[0].To)
	require.EqualValues(t, *out.RideID, receipts[0].RideID)
	require.Equal(t, *out.ChargeID, receipts[0].ChargeID)
	require.Equal(t, 1, b.queuedReceipts(t), "the replay queued nothing")
}

func TestDeclineIsAStored402(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.post(t, "user-bad-source@example.com", "k", rideBody)
	require.Equal(t, 402, first.status, "%s", first.body)
	replay := b.post(t, "user-bad-source@example.com", "k", rideBody)
	require.Equal(t, 402, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, replay.body)
	require.Empty(t, b.fake.Charges())
	require.Equal(t, 1, b.fake.Requests(), "the replay did not call the payment API")
	require.Zero(t, b.queuedReceipts(t), "a declined ride queues no receipt")
}

func TestUnauthorizedStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.post(t, "", "k", rideBody), 401)
	requireProblem(t, b.post(t, "stranger@example.com", "k", rideBody), 401)
	requireProblem(t, b.post(t, "user\xff@example.com", "k", rideBody), 401) // not UTF-8: no such user, not a 503
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))
}

func TestKeyRequiredAndWellFormed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.post(t, "user@example.com", "\x00none", rideBody), 400)
	for _, key := range []string{``, `""`, strings.Repeat("k", 256), "caf\u00e9", `"a", "b"`} {
		requireProblem(t, b.post(t, "user@example.com", key, rideBody), 400)
	}
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))
}

func TestInvalidBodyIs422AndACorrectedRetryIsProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, body := range []string{`not json`, `{"origin_lat": 1}`, `{"origin_lat": 91, "origin_lon": 0, "target_lat": 0, "target_lon": 0}`,
		`{"origin_lat": 0, "origin_lon": -181, "target_lat": 0, "target_lon": 0}`, `{"origin_lat": null, "origin_lon": 0, "target_lat": 0, "target_lon": 0}`,
		`{"origin_lat": "0", "origin_lon": 0, "target_lat": 0, "target_lon": 0}`, `[]`} {
		requireProblem(t, b.post(t, "user@example.com", "k", body), 422)
	}
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))
	require.Equal(t, 201, b.post(t, "user@example.com", "k", rideBody).status)
}

func TestSameKeyDifferentBodyIs422(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, 201, b.post(t, "user@example.com", "k", rideBody).status)
	other := `{"origin_lat": 1, "origin_lon": 2, "target_lat": 3, "target_lon": 4}`
	requireProblem(t, b.post(t, "user@example.com", "k", other), 422)
	// Member order and whitespace are not a different body.
	reordered := `{ "target_lon": -122.27, "target_lat": 37.80, "origin_lon": -122.42, "origin_lat": 37.77 }`
	require.Equal(t, 201, b.post(t, "user@example.com", "k", reordered).status)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides"))
}

func TestKeysAreScopedToTheUser(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, 201, b.post(t, "user@example.com", "shared", rideBody).status)
	require.Equal(t, 402, b.post(t, "user-bad-source@example.com", "shared", rideBody).status)
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM rides"))
}

func TestTransientPaymentFailureResumesAtTheCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.fake.FailNext(1)
	r := b.post(t, "user@example.com", "k", rideBody)
	require.GreaterOrEqual(t, r.status, 500, "%s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var point string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT recovery_point FROM idempotency_keys").Scan(&point))
	require.Equal(t, "create_ride", point, "the ride is recorded; nothing else is stored")

	ok := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, 201, ok.status)
	require.Empty(t, ok.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides"), "the retry did not create the ride again")
	require.Len(t, b.fake.Charges(), 1)
}

// A network blip at the payment API (the connection dropped before an
// answer) is one failed call and a 503 the client retries, not a permanent
// failure. stripe-go retries such a blip on its own by default; through
// the phase's one-call transport that retry is a second send, refused as a
// programming error that parks the key. The example turns the SDK's
// retries off (MaxNetworkRetries 0): the payment API sees one request per
// attempt, and the client's retry, with the same key, charges once.
func TestPaymentAPIBlipIsRetriedNotParked(t *testing.T) {
	t.Parallel()
	fake, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	target, err := url.Parse(fake.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var requests atomic.Int32
	blip := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close() // dropped before any answer
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(blip.Close)
	b := setup(t, &setupOpts{stripeBase: blip.URL})
	r := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	require.EqualValues(t, 1, requests.Load(), "the SDK did not send the charge again on its own")
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys WHERE parked_at IS NOT NULL"))
	ok := b.post(t, "user@example.com", "k", rideBody)
	require.Equal(t, http.StatusCreated, ok.status, "%s", ok.body)
	require.Len(t, fake.Charges(), 1)
}

func TestUnreachablePaymentAPIIsTransient(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	b := setup(t, &setupOpts{stripeBase: dead})
	r := b.post(t, "user@example.com", "k", rideBody)
	require.GreaterOrEqual(t, r.status, 500)
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys WHERE response_status IS NOT NULL"))
}

func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	bodies := make([][]byte, 20)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.post(t, "user@example.com", "rush", rideBody)
			statuses[i], bodies[i] = r.status, r.body
			if r.status == 409 {
				require.NotEmpty(t, r.header.Get("Retry-After"))
			}
		}()
	}
	wg.Wait()
	var final []byte
	for i, s := range statuses {
		require.Contains(t, []int{201, 409}, s)
		if s == 201 {
			if final == nil {
				final = bodies[i]
			}
			require.Equal(t, final, bodies[i])
		}
	}
	require.NotNil(t, final)
	require.Len(t, b.fake.Charges(), 1)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM rides"))
	require.Len(t, b.waitReceipts(t, 1), 1)
	require.Equal(t, 1, b.queuedReceipts(t))
}

func TestNoDatabaseErrorSaysWhatToDo(t *testing.T) {
	t.Parallel()
	err := noDatabaseError(pgtemp.ErrNoBinaries)
	require.ErrorIs(t, err, pgtemp.ErrNoBinaries)
	for _, want := range []string{"DATABASE_URL", "initdb", "make demo", "Docker"} {
		require.ErrorContains(t, err, want)
	}
}

// A ride's id tells a rider nothing about other riders' rides: ids are
// drawn at random, not taken from a sequence all riders share.
func TestRideIDsCannotBeCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var ids []int64
	for _, key := range []string{"ride-a", "ride-b", "ride-c"} {
		r := b.post(t, "user@example.com", key, rideBody)
		require.Equal(t, 201, r.status, string(r.body))
		var body struct {
			RideID int64 `json:"ride_id"`
		}
		require.NoError(t, json.Unmarshal(r.body, &body))
		require.Positive(t, body.RideID)
		require.Less(t, body.RideID, int64(1)<<53, "a JSON number holds it exactly")
		ids = append(ids, body.RideID)
	}
	for i := 1; i < len(ids); i++ {
		diff := ids[i] - ids[i-1]
		require.False(t, diff > -1000 && diff < 1000, "ride ids %v follow each other: they count the rides", ids)
	}
}
