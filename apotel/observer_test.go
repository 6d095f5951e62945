package apotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
)

// TestObserverReportsEveryDecisionOnce runs a script of requests that makes
// every decision the Runner and the Sweeper report, then checks the exact
// count of every metric per attribute set, and the spans of every request.
func TestObserverReportsEveryDecisionOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, &atomicphase.Config{AttemptBackoff: time.Millisecond})
	wf := b.orderWorkflow(t)
	run := func(ctx context.Context, scope, key, item string) (*atomicphase.Response, error) {
		return b.runner.Run(ctx, wf, order(scope, key, item))
	}
	// retry is run for a request its client marks as a retry, as aphttp's
	// client does: its key is read before any phase runs.
	marked := func(ctx context.Context, scope, key, item string) (*atomicphase.Response, error) {
		req := order(scope, key, item)
		req.Retry = true
		return b.runner.Run(ctx, wf, req)
	}

	// A new key, its replay, and its reuse with another request.
	b.step("new", func(ctx context.Context) {
		resp, err := run(ctx, "s-new", "new", "rocket")
		require.NoError(t, err)
		require.False(t, resp.Replayed)
	})
	b.step("replay", func(ctx context.Context) {
		resp, err := marked(ctx, "s-new", "new", "rocket")
		require.NoError(t, err)
		require.True(t, resp.Replayed)
	})
	// Unmarked, a replay's first phase runs ahead of the key's read: its
	// span says it was discarded, and no phase event is reported.
	b.step("unmarked replay", func(ctx context.Context) {
		resp, err := run(ctx, "s-new", "new", "rocket")
		require.NoError(t, err)
		require.True(t, resp.Replayed)
	})
	b.step("misuse", func(ctx context.Context) {
		_, err := run(ctx, "s-new", "new", "balloon")
		require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	})

	// The first attempt at "held" stalls in its charge; a duplicate finds
	// the key in progress; once the lock is aged past the lock timeout, a
	// third takes the key over and finishes; the first, let go, loses its
	// lock at commit.
	entered, release := make(chan struct{}), make(chan struct{})
	b.charges.then("held", func(context.Context) error {
		close(entered)
		<-release
		return nil
	})
	firstDone := make(chan error, 1)
	go func() {
		var err error
		b.step("held first", func(ctx context.Context) { _, err = run(ctx, "s-held", "held", "rocket") })
		firstDone <- err
	}()
	wait(t, entered, "the first attempt's charge")
	b.step("held duplicate", func(ctx context.Context) {
		_, err := run(ctx, "s-held", "held", "rocket")
		var ip *atomicphase.InProgressError
		require.ErrorAs(t, err, &ip)
	})
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET locked_at = locked_at - interval '1 hour', next_attempt_at = coalesce(next_attempt_at, created_at) WHERE idempotency_key = 'held'`)
	require.NoError(t, err)
	b.step("held takeover", func(ctx context.Context) {
		resp, err := marked(ctx, "s-held", "held", "rocket")
		require.NoError(t, err)
		require.Equal(t, 201, resp.Status)
	})
	close(release)
	require.ErrorIs(t, <-firstDone, atomicphase.ErrLockLost)

	// A charge that fails once, and the retry that resumes at it.
	b.charges.then("flaky", fail(errors.New("card network timeout")))
	b.step("flaky first", func(ctx context.Context) {
		_, err := run(ctx, "s-flaky", "flaky", "rocket")
		require.ErrorContains(t, err, "card network timeout")
	})
	b.step("flaky retry", func(ctx context.Context) {
		resp, err := marked(ctx, "s-flaky", "flaky", "rocket")
		require.NoError(t, err)
		require.False(t, resp.Replayed)
	})

	// A permanent failure parks the key.
	b.charges.then("doomed", fail(atomicphase.Permanent(errors.New("card reported stolen"))))
	b.step("doomed", func(ctx context.Context) {
		_, err := run(ctx, "s-doomed", "doomed", "rocket")
		var pe *atomicphase.PhaseError
		require.ErrorAs(t, err, &pe)
		require.True(t, pe.Parked)
	})

	// A key whose charge failed and whose client never came back, and one
	// of a workflow the sweeping Runner has not registered, left by
	// another process that reports to the same Observer.
	b.charges.then("abandoned", fail(errors.New("card network timeout")))
	b.step("abandoned", func(ctx context.Context) {
		_, err := run(ctx, "s-abandoned", "abandoned", "rocket")
		require.ErrorContains(t, err, "card network timeout")
	})
	other, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Observer: b.obs})
	require.NoError(t, err)
	legacy := atomicphase.MustWorkflow("legacy", func(struct{}, *atomicphase.Request) (struct{}, error) { return struct{}{}, nil },
		[]atomicphase.Phase[struct{}]{atomicphase.Local("migrate", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, errors.New("not yet")
		})}, nil)
	b.step("legacy", func(ctx context.Context) {
		_, err := other.Run(ctx, legacy, atomicphase.Request{Scope: "s-legacy", Key: "legacy", Method: "POST", Path: "/legacy"})
		require.ErrorContains(t, err, "not yet")
		// Its backoff over, the key is due: the sweep counts it.
		_, err = b.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET next_attempt_at = created_at WHERE workflow = 'legacy'`)
		require.NoError(t, err)
	})

	// The sweep completes the abandoned key, leaves the legacy one alone,
	// and deletes every finished key.
	sweeper, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{Retention: time.Nanosecond})
	require.NoError(t, err)
	b.step("sweep", func(ctx context.Context) {
		res, err := sweeper.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, atomicphase.SweepResult{Examined: 1, Completed: 1, UnknownWorkflow: 1, Reaped: 4}, res)
	})

	// A Runner whose key table is not there.
	broken, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Observer: b.obs, Schema: "absent"})
	require.NoError(t, err)
	b.step("store error", func(ctx context.Context) {
		_, err := broken.Run(ctx, wf, order("s-broken", "broken", "rocket"))
		require.ErrorContains(t, err, "acquire key")
	})

	const (
		wfOrder  = "workflow=order"
		wfLegacy = "workflow=legacy"
	)
	require.Equal(t, map[string]map[string]int64{
		"atomicphase.reserve.created":      {wfOrder: 5, wfLegacy: 1}, // new, held, flaky, doomed, abandoned
		"atomicphase.reserve.replay":       {wfOrder: 2},
		"atomicphase.reserve.key_misuse":   {wfOrder: 1},
		"atomicphase.reserve.in_progress":  {wfOrder: 1},
		"atomicphase.reserve.takeover":     {wfOrder: 1},
		"atomicphase.reserve.failed_retry": {wfOrder: 2}, // flaky's retry, the sweep's resume
		"atomicphase.store.error":          {wfOrder: 1},
		"atomicphase.phase.committed": {
			"phase=create," + wfOrder: 5,
			"phase=charge," + wfOrder: 4, // new, held's takeover, flaky's retry, the sweep's resume
			"phase=finish," + wfOrder: 4,
		},
		"atomicphase.phase.failed": {
			"phase=charge," + wfOrder:   3, // flaky, doomed, abandoned
			"phase=finish," + wfOrder:   1, // held's first attempt: the commit charge's record step shares with finish found the lock lost
			"phase=migrate," + wfLegacy: 1,
		},
		"atomicphase.lock.lost":              {"phase=finish," + wfOrder: 1},
		"atomicphase.key.parked":             {"phase=charge," + wfOrder: 1},
		"atomicphase.zombie_key":             {"workflow=order": 1},
		"atomicphase.ttl_pruned":             {"": 4}, // new, held, flaky, abandoned
		"atomicphase.sweep.unknown_workflow": {"workflow=legacy": 1},
		apotel.DurationMetric: {
			"outcome=committed,phase=create," + wfOrder: 5,
			"outcome=committed,phase=charge," + wfOrder: 4,
			"outcome=committed,phase=finish," + wfOrder: 4,
			"outcome=failed,phase=charge," + wfOrder:    3,
			"outcome=failed,phase=finish," + wfOrder:    1,
			"outcome=failed,phase=migrate," + wfLegacy:  1,
		},
	}, collect(t, b.reader))

	// The spans: under each step's span, one request span, with the
	// decisions as events and a child span per phase run.
	type phase struct {
		name       string
		failed     bool
		rolledBack bool
		discarded  bool
	}
	var (
		created    = ev(atomicphase.EventCreated)
		committed  = ev(atomicphase.EventPhaseCommitted)
		failed     = ev(atomicphase.EventPhaseFailed)
		retry      = ev(atomicphase.EventFailedRetry)
		exception  = "exception" // RecordError's event
		create     = phase{name: "create"}
		charge     = phase{name: "charge"}
		finish     = phase{name: "finish"}
		chargeFail = phase{name: "charge", failed: true}
		finishFail = phase{name: "finish", failed: true}
		// charge's record step shares finish's transaction, and rolls
		// back with it.
		chargeRolledBack = phase{name: "charge", rolledBack: true}
	)
	want := []struct {
		step     string
		workflow string
		events   []string
		phases   []phase
	}{
		{"new", "order", []string{created, committed, committed, committed}, []phase{create, charge, finish}},
		{"replay", "order", []string{ev(atomicphase.EventReplay)}, nil},
		{"unmarked replay", "order", []string{ev(atomicphase.EventReplay)}, []phase{{name: "create", discarded: true}}},
		{"misuse", "order", []string{ev(atomicphase.EventKeyMisuse), exception}, []phase{{name: "create", discarded: true}}},
		{"held first", "order", []string{created, committed, failed, ev(atomicphase.EventLockLost), exception}, []phase{create, chargeRolledBack, finishFail}},
		{"held duplicate", "order", []string{ev(atomicphase.EventInProgress), exception}, []phase{{name: "create", discarded: true}}},
		{"held takeover", "order", []string{ev(atomicphase.EventTakeover), committed, committed}, []phase{charge, finish}},
		{"flaky first", "order", []string{created, committed, failed, exception}, []phase{create, chargeFail}},
		{"flaky retry", "order", []string{retry, committed, committed}, []phase{charge, finish}},
		{"doomed", "order", []string{created, committed, failed, ev(atomicphase.EventParked), exception}, []phase{create, chargeFail}},
		{"abandoned", "order", []string{created, committed, failed, exception}, []phase{create, chargeFail}},
		{"legacy", "legacy", []string{created, failed, exception}, []phase{{name: "migrate", failed: true}}},
		{"sweep", "order", []string{retry, committed, committed}, []phase{charge, finish}}, // the resume
		{"store error", "order", []string{ev(atomicphase.EventStoreError), exception}, []phase{{name: "create", discarded: true}}},
	}
	tree := newSpanTree(b.spans)
	requests := 0
	for _, s := range tree.all {
		if s.Name() == apotel.RequestSpanName {
			requests++
		}
	}
	require.Equal(t, len(want), requests, "one request span per Run and Resume")
	for _, w := range want {
		step := tree.named(t, w.step)
		children := tree.children[step.SpanContext().SpanID()]
		require.Len(t, children, 1, "step %q: one request span", w.step)
		req := children[0]
		require.Equal(t, apotel.RequestSpanName, req.Name(), w.step)
		require.Equal(t, map[string]string{"workflow": w.workflow}, attrs(req.Attributes()), w.step)
		// A phase's own event goes to its span, open when it is observed.
		var requestEvents []string
		for _, e := range w.events {
			if e != committed && e != failed {
				requestEvents = append(requestEvents, e)
			}
		}
		require.Equal(t, requestEvents, eventNames(req), w.step)
		wantCode := codes.Unset
		if w.events[len(w.events)-1] == exception {
			wantCode = codes.Error
		}
		require.Equal(t, wantCode, req.Status().Code, w.step)

		phases := tree.children[req.SpanContext().SpanID()]
		require.Len(t, phases, len(w.phases), w.step)
		for i, p := range w.phases {
			got := phases[i]
			require.Equal(t, apotel.PhaseSpanPrefix+p.name, got.Name(), w.step)
			require.Equal(t, map[string]string{"workflow": w.workflow, "phase": p.name}, attrs(got.Attributes()), w.step)
			switch {
			case p.failed:
				require.Equal(t, codes.Error, got.Status().Code, "step %q phase %q", w.step, p.name)
				require.Equal(t, []string{failed, exception}, eventNames(got), "step %q phase %q", w.step, p.name)
			case p.discarded:
				require.Equal(t, codes.Unset, got.Status().Code, "step %q phase %q", w.step, p.name)
				require.Equal(t, []string{apotel.DiscardedEventName}, eventNames(got), "step %q phase %q", w.step, p.name)
			case p.rolledBack:
				require.Equal(t, codes.Error, got.Status().Code, "step %q phase %q", w.step, p.name)
				require.Equal(t, []string{exception}, eventNames(got), "step %q phase %q: neither committed nor failed itself", w.step, p.name)
			default:
				require.Equal(t, codes.Unset, got.Status().Code, "step %q phase %q", w.step, p.name)
				require.Equal(t, []string{committed}, eventNames(got), "step %q phase %q", w.step, p.name)
			}
			require.Empty(t, tree.children[got.SpanContext().SpanID()], "a phase span has no children")
		}
	}

	// The sweep's own decisions go to the span it ran under.
	sweep := tree.named(t, "sweep")
	require.Equal(t, []string{ev(atomicphase.EventUnknownWorkflow), ev(atomicphase.EventZombieKey), ev(atomicphase.EventTTLPruned)},
		eventNames(sweep))
	require.Equal(t, map[string]string{"count": "1", "workflow": "legacy"}, attrs(sweep.Events()[0].Attributes))
	require.Equal(t, map[string]string{"workflow": "order"}, attrs(sweep.Events()[1].Attributes))
	require.Equal(t, map[string]string{"count": "4"}, attrs(sweep.Events()[2].Attributes))
}

// TestNewDefaultsToGlobalProviders makes an Observer with nil Options; the
// global providers are no-ops until a program sets its own.
func TestNewDefaultsToGlobalProviders(t *testing.T) {
	t.Parallel()
	obs, err := apotel.New(nil)
	require.NoError(t, err)
	ctx, end := obs.StartSpan(context.Background(), atomicphase.Span{Kind: atomicphase.SpanRequest, Workflow: "order"})
	obs.Observe(ctx, atomicphase.Event{Kind: atomicphase.EventCreated, Workflow: "order"})
	end(nil)
}

// TestNewReportsRefusedInstruments gives New a provider that refuses every
// instrument: New says which.
func TestNewReportsRefusedInstruments(t *testing.T) {
	t.Parallel()
	obs, err := apotel.New(&apotel.Options{MeterProvider: refusingProvider{}})
	require.Nil(t, obs)
	require.ErrorIs(t, err, errRefused)
	require.ErrorContains(t, err, "apotel: histogram atomicphase.phase.duration: refused")
	require.ErrorContains(t, err, "apotel: counter for reserve.created: refused")
	require.ErrorContains(t, err, "apotel: counter for sweep.unknown_workflow: refused")
}

var errRefused = errors.New("refused")

// refusingProvider makes meters that refuse every instrument New makes.
type refusingProvider struct{ noop.MeterProvider }

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ noop.Meter }

func (refusingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return nil, errRefused
}

func (refusingMeter) Float64Histogram(string, ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return nil, errRefused
}
