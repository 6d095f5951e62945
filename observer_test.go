package atomicphase_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// recorder is an Observer that keeps every event and span.
type recorder struct {
	mu     sync.Mutex
	events []atomicphase.Event
	spans  []recordedSpan
}

type recordedSpan struct {
	span   atomicphase.Span
	parent int // index of the enclosing span + 1; 0 for none
	ended  bool
	err    error
}

type spanKey struct{}

func (r *recorder) Observe(_ context.Context, e atomicphase.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) StartSpan(ctx context.Context, s atomicphase.Span) (context.Context, func(error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	parent, _ := ctx.Value(spanKey{}).(int)
	r.spans = append(r.spans, recordedSpan{span: s, parent: parent})
	i := len(r.spans) - 1
	return context.WithValue(ctx, spanKey{}, i+1), func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.spans[i].ended, r.spans[i].err = true, err
	}
}

// take returns the kinds observed since the last take, and forgets them.
func (r *recorder) take() []atomicphase.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var kinds []atomicphase.EventKind
	for _, e := range r.events {
		kinds = append(kinds, e.Kind)
	}
	r.events = nil
	return kinds
}

func (r *recorder) takeSpans() []recordedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.spans
	r.spans = nil
	return s
}

// Each decision is observed exactly once per occurrence, in order, with a
// request span around each Run and a phase span, its child, around each
// phase.
func TestObserverSeesEachDecisionOnce(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec, FaultInjector: crashOnce("charge", atomicphase.AfterForeign),
		RedactKey: func(scope, key string) (string, string) { return "s:" + scope, "k:" + key }})
	var c counters
	failFinish := true
	entered, release := make(chan struct{}), make(chan struct{})
	holdFinish := false
	wf := orderWorkflow(t, &c, hooks{finish: func(ctx context.Context, tx pgx.Tx, s *orderState) error {
		if holdFinish {
			holdFinish = false
			close(entered)
			<-release
		}
		if s.Item == "flaky" && failFinish {
			failFinish = false
			return errors.New("transient")
		}
		return nil
	}})
	const (
		created   = atomicphase.EventCreated
		committed = atomicphase.EventPhaseCommitted
		failed    = atomicphase.EventPhaseFailed
	)

	// The first key crashes after its charge (the injector fires once).
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "crashed"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	require.Equal(t, []atomicphase.EventKind{created, committed, failed}, rec.take())
	spans := rec.takeSpans()
	require.Len(t, spans, 3)
	require.Equal(t, atomicphase.SpanRequest, spans[0].span.Kind)
	require.Equal(t, "s:u", spans[0].span.Scope, "redacted")
	require.Equal(t, "k:crashed", spans[0].span.Key)
	for _, s := range spans[1:] {
		require.Equal(t, atomicphase.SpanPhase, s.span.Kind)
		require.Equal(t, 1, s.parent, "a phase span is the request span's child")
		require.True(t, s.ended)
	}
	require.Error(t, spans[0].err)
	require.Error(t, spans[2].err, "the crashed phase's span ends with its error")

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "new"))
	require.NoError(t, err)
	require.Equal(t, []atomicphase.EventKind{created, committed, committed, committed}, rec.take())
	require.Len(t, rec.takeSpans(), 4)

	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "new"))
	require.NoError(t, err)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventReplay}, rec.take(), "a replay is one replay")

	mismatch := orderRequest("u", "new")
	mismatch.Params = []byte(`{"item":"other","quantity":1}`)
	_, err = b.runner.Run(b.ctx, wf, mismatch)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventKeyMisuse}, rec.take())

	holdFinish = true
	done := make(chan error)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "held"))
		done <- err
	}()
	<-entered
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "held"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	close(release)
	require.NoError(t, <-done)
	require.ElementsMatch(t, []atomicphase.EventKind{created, atomicphase.EventInProgress, committed, committed, committed}, rec.take())

	flaky := orderRequest("u", "flaky")
	flaky.Params = []byte(`{"item":"flaky","quantity":1}`)
	_, err = b.runner.Run(b.ctx, wf, flaky)
	require.Error(t, err)
	// finish failed in the transaction it shares with charge's record
	// step; charge's result is then committed on its own.
	require.Equal(t, []atomicphase.EventKind{created, committed, failed, committed}, rec.take())
	_, err = b.runner.Run(b.ctx, wf, flaky)
	require.NoError(t, err)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventFailedRetry, committed}, rec.take(), "resumed at the failed phase")

	ageLocks(t, b)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "crashed"))
	require.NoError(t, err)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventTakeover, committed, committed}, rec.take(), "a takeover is one takeover")

	perm := atomicphase.MustWorkflow("perm", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("no", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("never"))
		}),
	}, nil)
	_, err = b.runner.Run(b.ctx, perm, atomicphase.Request{Scope: "u", Key: "perm", Method: "POST", Path: "/"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	// The phase failed before anything was sent, its transaction with the
	// key's recording in it: the key is recorded on its own after, to be
	// parked.
	require.Equal(t, []atomicphase.EventKind{failed, created, atomicphase.EventParked}, rec.take())

	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET finished_at = (finished_at AT TIME ZONE 'UTC' - interval '2 days') AT TIME ZONE 'UTC',
		created_at = (created_at AT TIME ZONE 'UTC' - interval '2 days') AT TIME ZONE 'UTC'`)
	require.NoError(t, err)
	res, err := newSweeper(t, b, &atomicphase.SweepConfig{Retention: time.Hour}).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 4, res.Reaped)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventTTLPruned}, rec.take(), "one batch, one event")
	_ = resp
}

func TestObserverSeesStoreErrorsAndTheLimit(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	runner, err := atomicphase.NewRunner(unreachablePool(t), &atomicphase.Config{Observer: rec})
	require.NoError(t, err)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err = runner.Run(context.Background(), wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventStoreError}, rec.take())

	limited := setup(t, &atomicphase.Config{Observer: rec, MaxUnfinishedPerScope: 1})
	entered, release := make(chan struct{}), make(chan struct{})
	// The first key is held in its foreign call, recorded and committed:
	// a key still inside its first transaction is not counted yet.
	held := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		close(entered)
		<-release
		return call.Do(ctx, func(context.Context, string) error { return nil })
	}})
	done := make(chan error)
	go func() {
		_, err := limited.runner.Run(limited.ctx, held, orderRequest("u", "first"))
		done <- err
	}()
	<-entered
	_, err = limited.runner.Run(limited.ctx, held, orderRequest("u", "second"))
	require.ErrorIs(t, err, atomicphase.ErrTooManyKeys)
	require.True(t, atomicphase.Retryable(err), "a 429 is retryable")
	close(release)
	require.NoError(t, <-done)
	kinds := rec.take()
	require.Contains(t, kinds, atomicphase.EventOverLimit)
	n := 0
	for _, k := range kinds {
		if k == atomicphase.EventOverLimit {
			n++
		}
	}
	require.Equal(t, 1, n)
}

// A sweep reports the keys it completed and those it cannot resume.
func TestObserverSeesTheSweep(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec, FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	// A key of a workflow this process does not know.
	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, status)
		VALUES ('u', 'other', 'elsewhere', '\x00', 'POST', '/', '{}', 'w')`)
	require.NoError(t, err)
	ageLocks(t, b)
	rec.take()
	res, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 1, res.UnknownWorkflow)
	require.Equal(t, []atomicphase.EventKind{atomicphase.EventUnknownWorkflow, atomicphase.EventTakeover,
		atomicphase.EventPhaseCommitted, atomicphase.EventPhaseCommitted, atomicphase.EventZombieKey}, rec.take())
}

// RedactError rewrites error text on every path it leaves by: the stored
// last error, the log, the events and the spans; what callers branch on
// (errors.Is) still holds.
func TestRedactErrorCoversEveryPath(t *testing.T) {
	t.Parallel()
	const card = "4242424242424242"
	var logs bytes.Buffer
	var mu sync.Mutex
	var seen []string
	var sentinelSeen bool
	sentinel := errors.New("card refused")
	obs := &recordingObserver{
		observe: func(e atomicphase.Event) {
			mu.Lock()
			defer mu.Unlock()
			if e.Err != nil {
				seen = append(seen, e.Err.Error())
				sentinelSeen = sentinelSeen || errors.Is(e.Err, sentinel)
			}
		},
		end: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				seen = append(seen, err.Error())
			}
		},
	}
	b := setup(t, &atomicphase.Config{
		Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
		Observer:    obs,
		RedactError: func(msg string) string { return strings.ReplaceAll(msg, card, "[card]") },
	})
	wf := atomicphase.MustWorkflow("redacted", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("charge", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(fmt.Errorf("%w: card %s", sentinel, card))
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: "k", Method: "POST", Path: "/"})
	require.ErrorIs(t, err, sentinel, "the caller still gets the error as it was")
	info, err := b.runner.Inspect(b.ctx, "s", "k")
	require.NoError(t, err)
	require.NotNil(t, info.LastError)
	require.Contains(t, *info.LastError, "[card]")
	require.NotContains(t, *info.LastError, card, "the stored error is redacted")
	require.Contains(t, logs.String(), "[card]")
	require.NotContains(t, logs.String(), card, "the log is redacted")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	for _, s := range seen {
		require.NotContains(t, s, card, "events and spans are redacted")
	}
	require.True(t, sentinelSeen, "an observer's errors.Is still sees the original")
}

// recordingObserver hands its events and span ends to functions.
type recordingObserver struct {
	observe func(atomicphase.Event)
	end     func(error)
}

func (o *recordingObserver) Observe(_ context.Context, e atomicphase.Event) { o.observe(e) }

func (o *recordingObserver) StartSpan(ctx context.Context, _ atomicphase.Span) (context.Context, func(error)) {
	return ctx, o.end
}

// A finished key keeps no error of its failed attempts: the text may quote
// what the client sent, and the answer is stored now.
func TestFinishedKeyForgetsItsLastError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var failed atomic.Bool
	wf := atomicphase.MustWorkflow("forgets_error", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("charge", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			if !failed.Swap(true) {
				return atomicphase.Outcome{}, errors.New("card 4242424242424242 declined by the network")
			}
			return atomicphase.Respond(201, []byte("ok")), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "s", Key: "k", Method: "POST", Path: "/"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	info, err := b.runner.Inspect(b.ctx, "s", "k")
	require.NoError(t, err)
	require.NotNil(t, info.LastError, "an unfinished key keeps why its attempt failed")
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	info, err = b.runner.Inspect(b.ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Nil(t, info.LastError, "a finished key forgets it")
}
