package apui

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// hostileError is a client-supplied text in a stored error: an OSC 8
// hyperlink and a clear-screen, which must reach no operator's screen raw.
const hostileError = "name \x1b]8;;http://evil.example/\x07click me\x1b]8;;\x07 refused\x1b[2J\nsecond line"

type state struct {
	Item    string
	LabelID string
}

// testBundle is one test's database, Runner and console.
type testBundle struct {
	db       *atomicphasetest.DB
	runner   *atomicphase.Runner
	ctx      context.Context
	srv      *httptest.Server
	client   *http.Client
	labels   *int   // calls the label downstream took
	labelRef string // the downstream key the label call was sent with
	opts     *Options
	handler  *Handler
	workflow map[string]*atomicphase.Workflow[state]
}

// setup gives the test a database holding, built by the library itself:
//
//	bob/parked-1..3, dave/parked-4  payout  parked (a permanent failure)
//	alice/finished-1                checkout finished
//	erin/hostile-1                  refund  abandoned, its error carries escapes
//	frank/unknown-1                 label   unknown: the call failed, reconcile cannot tell
//
// and a console on it (opts adjusts its options), reached by a client
// that keeps cookies.
func setup(t *testing.T, opts *Options) *testBundle {
	t.Helper()
	db := atomicphasetest.NewDB(t, nil)
	// The fixtures' downstream calls fail without acting: nothing of them
	// is in flight, and an operator may act at once (Config.CallGrace).
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{CallGrace: time.Nanosecond})
	require.NoError(t, err)
	b := &testBundle{db: db, runner: runner, ctx: context.Background(), labels: new(int)}
	start := func(_ struct{}, req *atomicphase.Request) (state, error) { return state{Item: req.Key}, nil }
	respond := func(ctx context.Context, tx atomicphase.Tx, s *state) (atomicphase.Outcome, error) {
		return atomicphase.Respond(201, []byte(`{"item":"`+s.Item+`","label":"`+s.LabelID+`"}`)).WithHeader("Content-Type", "application/json"), nil
	}
	callFailed := true
	b.workflow = map[string]*atomicphase.Workflow[state]{
		"checkout": atomicphase.MustWorkflow("checkout", start, []atomicphase.Phase[state]{
			atomicphase.Local("charge", respond)}, nil),
		"payout": atomicphase.MustWorkflow("payout", start, []atomicphase.Phase[state]{
			atomicphase.Local("payout", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("account closed: payouts to it are refused"))
			})}, nil),
		"refund": atomicphase.MustWorkflow("refund", start, []atomicphase.Phase[state]{
			atomicphase.Local("refund", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
				return atomicphase.Outcome{}, errors.New(hostileError)
			})}, nil),
		"label": atomicphase.MustWorkflow("label", start, []atomicphase.Phase[state]{
			atomicphase.Foreign("buy_label", func(ctx context.Context, call *atomicphase.ForeignCall, s *state) error {
				return call.Do(ctx, func(_ context.Context, ref string) error {
					*b.labels++
					b.labelRef = ref
					if callFailed {
						return errors.New("label service: connection reset")
					}
					s.LabelID = "lbl-1"
					return nil
				})
			}, nil).WithReconcile(func(_ context.Context, call *atomicphase.ForeignCall, s *state) (bool, error) {
				if res, ok := call.OperatorResult(); ok {
					return true, json.Unmarshal(res, &s.LabelID)
				}
				return false, errors.New("label lookup is down")
			}),
			atomicphase.Local("confirm", respond)}, nil),
	}
	run := func(workflow, scope, key string) {
		_, _ = runner.Run(b.ctx, b.workflow[workflow], atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/" + workflow})
	}
	for _, k := range []struct{ workflow, scope, key string }{
		{"payout", "bob", "parked-1"}, {"payout", "bob", "parked-2"}, {"payout", "bob", "parked-3"}, {"payout", "dave", "parked-4"},
		{"checkout", "alice", "finished-1"}, {"refund", "erin", "hostile-1"}, {"label", "frank", "unknown-1"},
	} {
		run(k.workflow, k.scope, k.key)
	}
	callFailed = false
	want := map[string]atomicphase.KeyStatus{"parked-1": "parked", "parked-2": "parked", "parked-3": "parked", "parked-4": "parked",
		"finished-1": "finished", "hostile-1": "abandoned", "unknown-1": "unknown"}
	keys, err := runner.ListKeys(b.ctx, nil)
	require.NoError(t, err)
	got := map[string]atomicphase.KeyStatus{}
	for _, k := range keys {
		got[k.Key] = k.Status
	}
	require.Equal(t, want, got, "setup built the wrong statuses")

	o := &Options{Runner: runner}
	if opts != nil {
		o = opts
		o.Runner = runner
	}
	b.opts = o
	h, err := NewHandler(o)
	require.NoError(t, err)
	b.handler = h
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	b.client = &http.Client{Jar: jar}
	return b
}

// get fetches a page of the console and returns its status and body.
func (b *testBundle) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := b.client.Get(b.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// post posts a form and returns the status and body it ends on.
func (b *testBundle) post(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	resp, err := b.client.PostForm(b.srv.URL+path, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// csrf reads the token a page's forms carry.
func csrf(t *testing.T, body string) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries a form token")
	return m[1]
}

func (b *testBundle) inspect(t *testing.T, scope, key string) *atomicphase.KeyInfo {
	t.Helper()
	k, err := b.runner.Inspect(b.ctx, scope, key)
	require.NoError(t, err)
	return k
}

func (b *testBundle) exists(t *testing.T, scope, key string) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2", scope, key).Scan(&n))
	return n == 1
}

// text is a page's body with tags and runs of white space dropped, to
// assert what a reader sees.
func text(body string) string {
	s := regexp.MustCompile(`(?s)<[^>]*>`).ReplaceAllString(body, " ")
	return strings.Join(strings.Fields(s), " ")
}

// newRecorder serves path with h and returns the body.
func newRecorder(h http.Handler, path string) string {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Body.String()
}
