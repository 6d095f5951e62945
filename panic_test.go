package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A panic anywhere in a request, the application's code or a hook's, keeps
// nothing: no pooled connection, no key held by a lease that runs on, no
// goroutine. The panic still goes on to the caller (net/http's server,
// say, which closes the connection), but only once the request's
// resources are let go; the next request is served.

// armedAt is the one place a panicTest's request panics: "" for none.
type armedAt struct{ atomic.Value }

func (a *armedAt) at(point string) bool {
	if a == nil {
		return false
	}
	v, _ := a.Load().(string)
	return v == point
}

func (a *armedAt) hit(point string) {
	if a.at(point) {
		panic("panic in " + point)
	}
}

// panicInput is a request's input whose decoding panics when armed.
type panicInput struct {
	armed *armedAt
	N     int `json:"n"`
}

// panicTestArmed is the armedAt of the test running panicInput's decoding
// (a json.Unmarshaler has no other way to reach it): one test at a time.
var panicTestArmed atomic.Pointer[armedAt]

func (p *panicInput) UnmarshalJSON(b []byte) error {
	panicTestArmed.Load().hit("input")
	type plain panicInput
	return json.Unmarshal(b, (*plain)(p))
}

type panicState struct {
	N      int  `json:"n"`
	Called bool `json:"called"`
}

// panicObserver panics in each of its methods when armed there.
type panicObserver struct{ armed *armedAt }

func (o panicObserver) Observe(_ context.Context, e atomicphase.Event) {
	o.armed.hit("observe")
	o.armed.hit("observe " + string(e.Kind))
}

func (o panicObserver) StartSpan(ctx context.Context, s atomicphase.Span) (context.Context, func(error)) {
	o.armed.hit("span")
	return ctx, func(error) { o.armed.hit("span end") }
}

// panicWorkflows are the ways a request goes in: a workflow that begins
// with a local phase (its key recorded with its first unit), the same
// assuming new keys, and one that begins with a foreign phase (its key
// acquired on its own). Each has a local phase, a foreign phase with a
// reconcile function, and a responding phase.
func panicWorkflows(armed *armedAt, failCall *atomic.Bool) map[string]*atomicphase.Workflow[panicState] {
	start := func(in panicInput, _ *atomicphase.Request) (panicState, error) {
		armed.hit("start")
		return panicState{N: in.N}, nil
	}
	local := atomicphase.Local("local", func(ctx context.Context, tx atomicphase.Tx, s *panicState) (atomicphase.Outcome, error) {
		armed.hit("local")
		_, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('', '', 'local')`)
		return atomicphase.Continue(), err
	})
	foreign := atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *panicState) error {
		armed.hit("call")
		if failCall.Load() {
			return errors.New("the downstream timed out")
		}
		s.Called = true
		return nil
	}, func(context.Context, atomicphase.Tx, *panicState) (atomicphase.Outcome, error) {
		armed.hit("record")
		return atomicphase.Continue(), nil
	}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, s *panicState) (bool, error) {
		armed.hit("reconcile")
		return false, nil
	})
	respond := atomicphase.Local("respond", func(context.Context, atomicphase.Tx, *panicState) (atomicphase.Outcome, error) {
		armed.hit("respond")
		return atomicphase.Respond(201, []byte("done")), nil
	})
	return map[string]*atomicphase.Workflow[panicState]{
		"recorded with its first unit": atomicphase.MustWorkflow("panic_fused", start, []atomicphase.Phase[panicState]{local, foreign, respond}, nil),
		"assuming new keys": atomicphase.MustWorkflow("panic_assumed", start, []atomicphase.Phase[panicState]{local, foreign, respond},
			&atomicphase.WorkflowOpts{AssumeNewKeys: true}),
		"acquired on its own": atomicphase.MustWorkflow("panic_acquired", start, []atomicphase.Phase[panicState]{foreign, local, respond}, nil),
	}
}

// Not parallel: it counts the library's goroutines, which no other test
// runs meanwhile.
func TestAPanicAnywhereKeepsNothing(t *testing.T) {
	armed := &armedAt{}
	armed.Store("")
	require.True(t, panicTestArmed.CompareAndSwap(nil, armed), "one test at a time decodes panicInput")
	t.Cleanup(func() { panicTestArmed.Store(nil) })
	b := setup(t, nil)
	var failCall atomic.Bool
	workflows := panicWorkflows(armed, &failCall)
	points := []string{"start", "input", "local", "call", "record", "respond", "reconcile",
		"observe", "observe reserve.created", "observe phase.committed", "span", "span end", "redact key", "redact error", "log"}
	goroutines := libraryGoroutines()
	n := 0
	for way, wf := range workflows {
		for _, point := range points {
			n++
			key := fmt.Sprintf("k%d", n)
			t.Run(fmt.Sprintf("%s, a panic in %s", way, point), func(t *testing.T) {
				// A pool of its own, of two connections: one kept is
				// seen, and two would stop the next request. (One that
				// keeps a connection is left open: its Close would wait
				// for ever.)
				cfg, err := pgxpool.ParseConfig(b.db.URL)
				require.NoError(t, err)
				cfg.MaxConns = 2
				pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
				require.NoError(t, err)
				runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{
					Observer: panicObserver{armed},
					RedactKey: func(scope, key string) (string, string) {
						armed.hit("redact key")
						return scope, key
					},
					RedactError: func(msg string) string {
						armed.hit("redact error")
						return msg
					},
					Logger:      slog.New(panicHandler{armed}),
					LockTimeout: 10 * time.Second,
				})
				require.NoError(t, err)
				panicKeepsNothing(t, runner, pool, wf, key, point, armed, &failCall)
				pool.Close()
			})
		}
	}
	deadline := time.Now().Add(time.Minute)
	for libraryGoroutines() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, libraryGoroutines(), goroutines, "a goroutine of the library's outlives its request:\n%s", goroutineDump())
}

// panicKeepsNothing runs one case of TestAPanicAnywhereKeepsNothing: a
// request of wf that panics at point (or, for a hook, is served without
// it), then its retry, then another key's request, with nothing kept.
func panicKeepsNothing(t *testing.T, runner *atomicphase.Runner, pool *pgxpool.Pool, wf atomicphase.AnyWorkflow,
	key, point string, armed *armedAt, failCall *atomic.Bool) {
	t.Helper()
	req := atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/panic", Params: []byte(`{"n": 1}`)}
	if point == "reconcile" || point == "redact error" || point == "log" {
		// Reached after a failed call: the call fails once (its error
		// redacted), and the retry reconciles.
		failCall.Store(true)
		if point == "redact error" || point == "log" {
			armed.Store(point) // the failed call's error is logged too
		}
		_, _, _ = runSafely(runner, wf, req)
		failCall.Store(false)
	}
	armed.Store(point)
	_, _, panicked := runSafely(runner, wf, req)
	armed.Store("")
	if hook := point == "redact error" || point == "redact key" || point == "log" || strings.HasPrefix(point, "observe") || strings.HasPrefix(point, "span"); hook {
		require.False(t, panicked, "a hook's panic failed the request")
	} else {
		require.True(t, panicked, "the request did not panic")
	}
	require.Zero(t, pool.Stat().AcquiredConns(), "a pooled connection is kept")

	// The key is not held: a retry is answered now (it resumes, or says
	// why it may not), never told the key is in progress.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := runner.Run(ctx, wf, req)
	cancel()
	var inProgress *atomicphase.InProgressError
	require.False(t, errors.As(err, &inProgress), "the key is still held: %v", err)
	require.Zero(t, pool.Stat().AcquiredConns(), "a pooled connection is kept after the retry")

	// And the next request is served.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: key + "-next", Method: "POST", Path: "/panic", Params: []byte(`{"n": 2}`)})
	cancel()
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Zero(t, pool.Stat().AcquiredConns(), "a pooled connection is kept after the next request")
}

// libraryGoroutines counts the goroutines running the library's code.
func libraryGoroutines() int {
	return strings.Count(goroutineDump(), "\ngithub.com/atomicphase/atomicphase.")
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// panicHandler is a slog handler that panics when armed at "log".
type panicHandler struct{ armed *armedAt }

func (h panicHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h panicHandler) Handle(context.Context, slog.Record) error {
	h.armed.hit("log")
	return nil
}
func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicHandler) WithGroup(string) slog.Handler      { return h }

// A start function that ends its goroutine (runtime.Goexit, as t.FailNow
// does) keeps no connection either.
func TestAStartFunctionThatEndsItsGoroutineKeepsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	runner, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	type st struct{}
	var exit atomic.Bool
	exit.Store(true)
	wf := atomicphase.MustWorkflow("exits", func(struct{}, *atomicphase.Request) (st, error) {
		if exit.Load() {
			runtime.Goexit()
		}
		return st{}, nil
	}, []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	}()
	<-done
	require.Zero(t, pool.Stat().AcquiredConns(), "a pooled connection is kept")
	exit.Store(false)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
}

// runSafely runs req, reporting a panic instead of letting it go on.
func runSafely(r *atomicphase.Runner, wf atomicphase.AnyWorkflow, req atomicphase.Request) (resp *atomicphase.Response, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			panicked = true
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err = r.Run(ctx, wf, req)
	return resp, err, false
}

// A finished key's answer is its stored one, whatever the code does now: a
// retry after a deploy whose start function or first phase panics is
// replayed, in every way in (assuming new keys too, where the code runs
// before the key is read), and the key stays as it was.
func TestAFinishedKeysRetryIsItsStoredAnswerWhateverTheCodeDoesNow(t *testing.T) {
	t.Parallel()
	armed := &armedAt{}
	armed.Store("")
	b := setup(t, nil)
	var failCall atomic.Bool
	n := 0
	for way, wf := range panicWorkflows(armed, &failCall) {
		first := "local"
		if way == "acquired on its own" {
			first = "call"
		}
		for _, point := range []string{"start", first} {
			n++
			req := atomicphase.Request{Scope: "u", Key: fmt.Sprintf("done%d", n), Method: "POST", Path: "/panic", Params: []byte(`{"n": 1}`)}
			resp, err := b.runner.Run(b.ctx, wf, req)
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			before, err := b.runner.Inspect(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)

			armed.Store(point)
			replay, err, panicked := runSafely(b.runner, wf, req)
			armed.Store("")
			require.False(t, panicked, "%s, a panic in %s: the retry of a finished key panicked", way, point)
			require.NoError(t, err, "%s, a panic in %s", way, point)
			require.True(t, replay.Replayed, "%s, a panic in %s", way, point)
			require.Equal(t, resp.Status, replay.Status)
			require.Equal(t, resp.Body, replay.Body)
			after, err := b.runner.Inspect(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)
			require.Equal(t, before, after, "%s, a panic in %s: the finished key changed", way, point)
		}
	}
}

// A retry not marked as a retry runs its first unit's code before its key's
// read answers. When that code now panics (a deploy) for a key an earlier
// attempt left behind, the request is answered as a marked retry is: the
// key is taken and runs from where that attempt stopped, past the
// panicking phase (201), and a key that failed inside that phase is taken
// too, its attempt counted, and parked by the panic. The mark changes a
// request's cost, never its answer.
func TestAPanicAheadOfTheKeysReadIsAnsweredAsAMarkedRetryIs(t *testing.T) {
	t.Parallel()
	type st struct {
		Charge string `json:"charge"`
	}
	for _, marked := range []bool{true, false} {
		t.Run(fmt.Sprintf("marked=%v", marked), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var (
				panics, failFirst, failCall atomic.Bool
				calls                       atomic.Int32
			)
			wf := atomicphase.MustWorkflow("ahead", startEmpty[st], []atomicphase.Phase[st]{
				atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
					tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'first')`)
					if panics.Load() {
						panic("the first phase, as deployed now")
					}
					if failFirst.Load() {
						return atomicphase.Outcome{}, errors.New("the first phase failed")
					}
					return atomicphase.Continue(), nil
				}),
				atomicphase.Foreign("call", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
					return call.Do(ctx, func(ctx context.Context, key string) error {
						calls.Add(1)
						if failCall.Load() {
							return errors.New("the downstream is down")
						}
						s.Charge = "ch_" + key
						return nil
					})
				}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
					return atomicphase.Respond(201, []byte(s.Charge)), nil
				}),
			}, nil)
			req := func(key string) atomicphase.Request {
				r := atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/ahead"}
				r.Retry = marked
				return r
			}
			run := func(key string) (resp *atomicphase.Response, err error, p any) {
				defer func() { p = recover() }()
				resp, err = b.runner.Run(b.ctx, wf, req(key))
				return resp, err, nil
			}

			// Past the panicking phase: the call failed once, the key waits
			// at recovery point "first".
			failCall.Store(true)
			_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "past", Method: "POST", Path: "/ahead"})
			require.Error(t, err)
			failCall.Store(false)
			panics.Store(true)
			resp, err, p := run("past")
			require.Nil(t, p, "the retry met the panic of a phase it need not run")
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			require.Equal(t, int32(2), calls.Load(), "the call, once failed, made once more")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = 'first'`), "the first phase's write, kept once")

			// In the panicking phase: the key failed there; the retry takes
			// it (an attempt counted) and the panic parks it.
			panics.Store(false)
			failFirst.Store(true)
			_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "in", Method: "POST", Path: "/ahead"})
			require.Error(t, err)
			failFirst.Store(false)
			panics.Store(true)
			_, _, p = run("in")
			require.NotNil(t, p, "the phase that panics is the key's next")
			info, err := b.runner.Inspect(b.ctx, "u", "in")
			require.NoError(t, err)
			require.Equal(t, 2, info.Attempts, "the retry's attempt counted")
			require.True(t, info.ParkedForGood, "a panic parks the key it took: %+v", info)
			require.Zero(t, b.db.Pool.Stat().AcquiredConns())
		})
	}
}
