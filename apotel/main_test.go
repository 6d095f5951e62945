package apotel_test

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// testBundle is a database of the test's own, an Observer over in-memory
// providers, and a Runner reporting to it.
type testBundle struct {
	ctx     context.Context
	db      *atomicphasetest.DB
	reader  *sdkmetric.ManualReader
	spans   *recorder
	tracer  trace.Tracer // the test's own spans, which name the steps
	obs     *apotel.Observer
	runner  *atomicphase.Runner
	charges *chargeScript
}

// setup makes the bundle. opts' providers are replaced by the in-memory
// ones; cfg's Observer by the bundle's.
func setup(t *testing.T, opts *apotel.Options, cfg *atomicphase.Config) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), db: atomicphasetest.NewDB(t, nil), charges: &chargeScript{}}
	b.obs, b.reader, b.spans = newObserver(t, opts)
	b.tracer = b.spans.tracer

	var c atomicphase.Config
	if cfg != nil {
		c = *cfg
	}
	c.Observer = b.obs
	var err error
	b.runner, err = atomicphase.NewRunner(b.db.Pool, &c)
	require.NoError(t, err)
	return b
}

// recorder is the in-memory trace side: the spans ended, and a tracer of
// the test's own on the same provider.
type recorder struct {
	*tracetest.SpanRecorder
	tracer trace.Tracer
}

// newObserver returns an Observer over in-memory providers, with opts
// apart from the providers, and what reads them.
func newObserver(t *testing.T, opts *apotel.Options) (*apotel.Observer, *sdkmetric.ManualReader, *recorder) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rec := &recorder{SpanRecorder: tracetest.NewSpanRecorder()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec.SpanRecorder))
	t.Cleanup(func() {
		require.NoError(t, mp.Shutdown(context.Background()))
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	rec.tracer = tp.Tracer("test")

	var o apotel.Options
	if opts != nil {
		o = *opts
	}
	o.MeterProvider, o.TracerProvider = mp, tp
	obs, err := apotel.New(&o)
	require.NoError(t, err)
	return obs, reader, rec
}

// step runs fn under a span of the test's own, named name, whose child the
// request's span is: the way a test finds a request's span.
func (b *testBundle) step(name string, fn func(ctx context.Context)) {
	ctx, span := b.tracer.Start(b.ctx, name)
	defer span.End()
	fn(ctx)
}

// orderInput is what an order request carries.
type orderInput struct {
	Item string `json:"item"`
}

// orderState is the order workflow's state. It keeps the idempotency key so
// that the charge phase can look up what the test scripted for it.
type orderState struct {
	Item     string `json:"item"`
	Key      string `json:"key"`
	ChargeID string `json:"charge_id,omitempty"`
}

// orderWorkflow is create (local) → charge (foreign, scripted by
// b.charges) → finish (responds 201).
func (b *testBundle) orderWorkflow(t *testing.T) *atomicphase.Workflow[orderState] {
	t.Helper()
	start := func(in orderInput, req *atomicphase.Request) (orderState, error) {
		return orderState{Item: in.Item, Key: req.Key}, nil
	}
	wf, err := atomicphase.NewWorkflow("order", start, []atomicphase.Phase[orderState]{
		atomicphase.Local("create", func(context.Context, atomicphase.Tx, *orderState) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				if step := b.charges.next(s.Key); step != nil {
					if err := step(ctx); err != nil {
						return err
					}
				}
				s.ChargeID = "ch_" + key[:8]
				return nil
			})
		}, nil),
		atomicphase.Local("finish", func(context.Context, atomicphase.Tx, *orderState) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(`{"status":"ordered"}`)), nil
		}),
	}, nil)
	require.NoError(t, err)
	return wf
}

func order(scope, key, item string) atomicphase.Request {
	return atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/orders",
		Params: []byte(`{"item":"` + item + `"}`)}
}

// chargeScript says what the charge phase does, per key: each charge takes
// the next step queued for its key, and succeeds once none is left.
type chargeScript struct {
	mu    sync.Mutex
	steps map[string][]func(ctx context.Context) error
}

func (c *chargeScript) then(key string, step func(ctx context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.steps == nil {
		c.steps = map[string][]func(context.Context) error{}
	}
	c.steps[key] = append(c.steps[key], step)
}

func (c *chargeScript) next(key string) func(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.steps[key]
	if len(q) == 0 {
		return nil
	}
	c.steps[key] = q[1:]
	return q[0]
}

// fail is a charge step that fails with err.
func fail(err error) func(context.Context) error {
	return func(context.Context) error { return err }
}

// wait waits for ch to close, failing the test after a while.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// collect reads every metric: metric name → encoded attribute set
// ("phase=charge,workflow=order") → the counter's sum, or the histogram's
// count of measurements.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	enc := attribute.DefaultEncoder()
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			points := map[string]int64{}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				require.True(t, data.IsMonotonic, m.Name)
				for _, p := range data.DataPoints {
					points[p.Attributes.Encoded(enc)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points[p.Attributes.Encoded(enc)] = int64(p.Count)
				}
			default:
				t.Fatalf("metric %s has unexpected data %T", m.Name, m.Data)
			}
			if len(points) > 0 {
				out[m.Name] = points
			}
		}
	}
	return out
}

// spanTree indexes the ended spans by name and by parent.
type spanTree struct {
	all      []sdktrace.ReadOnlySpan
	children map[trace.SpanID][]sdktrace.ReadOnlySpan
}

func newSpanTree(rec *recorder) *spanTree {
	st := &spanTree{all: rec.Ended(), children: map[trace.SpanID][]sdktrace.ReadOnlySpan{}}
	sort.SliceStable(st.all, func(i, j int) bool { return st.all[i].StartTime().Before(st.all[j].StartTime()) })
	for _, s := range st.all {
		if s.Parent().IsValid() {
			st.children[s.Parent().SpanID()] = append(st.children[s.Parent().SpanID()], s)
		}
	}
	return st
}

// named returns the one ended span named name.
func (st *spanTree) named(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range st.all {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

// attrs returns a span's or event's attributes as a map.
func attrs(kvs []attribute.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// eventNames returns the names of a span's events, in order.
func eventNames(s sdktrace.ReadOnlySpan) []string {
	names := make([]string, 0, len(s.Events()))
	for _, e := range s.Events() {
		names = append(names, e.Name)
	}
	return names
}

// ev is the span event name of kind.
func ev(kind atomicphase.EventKind) string { return apotel.MetricPrefix + string(kind) }
