package atomicphase_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
)

// The answers docs/http.md and docs/operations.md promise, over HTTP.

type httpReply struct {
	status int
	header http.Header
	body   string
}

// serveWF serves POST /r with wf through the middleware on runner, scoped
// "u" (as revReq).
func serveWF(t *testing.T, runner *atomicphase.Runner, wf atomicphase.AnyWorkflow) func(key, body string) httpReply {
	t.Helper()
	srv := httptest.NewServer(aphttp.Middleware(runner, wf, &aphttp.Options{
		Scope: func(*http.Request) (string, error) { return "u", nil }})(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	return func(key, body string) httpReply {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+"/r", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return httpReply{resp.StatusCode, resp.Header, string(data)}
	}
}

// A key of version 2 retried at a process that runs only version 1 is
// answered 409 in-progress with a Retry-After, as docs/operations.md
// ("Deploys that change a workflow", step 2) says; before, 503
// transient-failure.
func TestHTTPOtherVersionsKeyIs409(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v2, "a", "k") // recorded under v2, its process gone
	procV2, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, procV2.Register(v2))
	require.NoError(t, procV2.RecordVersions(b.ctx)) // v2 still runs somewhere

	procV1, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	post := serveWF(t, procV1, v1)
	r := post("k", `{"name":"k"}`)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Contains(t, r.body, aphttp.ProblemInProgress)
	require.NotEmpty(t, r.header.Get("Retry-After"))

	resp, err := procV2.Run(b.ctx, v2, revReq("k"))
	require.NoError(t, err, "the version's own process finishes it")
	require.Equal(t, "k,a,c", string(resp.Body))
}

// A key parked after a panic inside a foreign call's quiet period is
// answered 500 parked at once: a parked key holds nothing, and the call's
// mark keeps it from being taken, not from being answered. Before, the
// client got 409 in-progress, Retry-After 1, for the lease plus the grace.
func TestHTTPPanicParkedKeyIs500ParkedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Hour})
	bk := newBank()
	wf := atomicphase.MustWorkflow("payout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			err := call.Do(ctx, func(ctx context.Context, ref string) error {
				id, err := bk.pay(ctx, ref)
				p.PayoutID = id
				return err
			})
			if err == nil {
				panic("a bug after the payout")
			}
			return err
		}, nil).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			return false, errors.New("unreachable in this test")
		}),
	}, nil)
	post := serveWF(t, b.runner, wf)
	func() {
		defer func() { _ = recover() }()
		_, _ = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"})
	}()
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.NotNil(t, info.CallUntil, "the call's mark is still in force")
	r := post("k", "")
	require.Equal(t, http.StatusInternalServerError, r.status, r.body)
	require.Contains(t, r.body, aphttp.ProblemParked)
	require.Empty(t, r.header.Get("Retry-After"))
	require.EqualValues(t, 1, bk.calls.Load())
}

// A key that no live attempt holds, only a foreign call's quiet period
// (its holder died inside the call), is answered 409 with the real end of
// the hold in Retry-After, and inspect shows it held until then. Before,
// every 409 said "retry after 1s" for the whole lease plus grace.
func TestHTTPRetryAfterTellsTheEndOfACallsHold(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Hour, FaultInjector: crashOnce("pay", atomicphase.AfterForeign)})
	bk := newBank()
	wf := payoutWorkflow(bk)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	// The lease runs out (the holder is dead); the call's grace does not.
	// (Shifted in UTC with immutable operators, which Citus accepts in an
	// UPDATE, as atomicphasetest.AgeLocks does, but leaving the call's mark.)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys
		SET locked_at = (locked_at AT TIME ZONE 'UTC' - interval '1 day') AT TIME ZONE 'UTC',
		    next_attempt_at = coalesce(next_attempt_at, created_at)
		WHERE scope = 'driver_1' AND idempotency_key = 'k'`)
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyInProgress, info.Status, "held by the call's mark")
	require.NotNil(t, info.LockExpiresIn)
	require.Greater(t, *info.LockExpiresIn, float64(30*60), "held for most of the grace")

	srv := httptest.NewServer(aphttp.Middleware(b.runner, wf, &aphttp.Options{
		Scope: func(*http.Request) (string, error) { return "driver_1", nil }})(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	req, err := http.NewRequest("POST", srv.URL+"/payouts", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.Greater(t, after, 30*60, "Retry-After is the end of the hold, not a second")
	require.EqualValues(t, 1, bk.calls.Load())
}
