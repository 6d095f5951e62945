package apotel_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
)

// TestMetricsCountKindsAddedLater observes kinds this package does not
// know, from many goroutines at once: each gets a counter of its own on its
// first event, and no event is lost to the race for making it.
func TestMetricsCountKindsAddedLater(t *testing.T) {
	t.Parallel()
	obs, reader, _ := newObserver(t, nil)
	ctx := context.Background()
	const goroutines, each = 8, 50
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				obs.Observe(ctx, atomicphase.Event{Kind: "reserve.unknown", Workflow: "order"})
				obs.Observe(ctx, atomicphase.Event{Kind: "reconcile.resolved", Workflow: "order", Phase: "charge", Count: 2})
			}
		})
	}
	wg.Wait()
	require.Equal(t, map[string]map[string]int64{
		"atomicphase.reserve.unknown":    {"workflow=order": goroutines * each},
		"atomicphase.reconcile.resolved": {"phase=charge,workflow=order": 2 * goroutines * each},
	}, collect(t, reader))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == "atomicphase.reserve.unknown" {
			require.Equal(t, "{event}", m.Unit)
			require.Equal(t, "atomicphase reserve.unknown events.", m.Description)
		}
	}
}

// TestMetricsDescribeEveryKnownKind checks the unit and description every
// known counter and the duration histogram are exported with.
func TestMetricsDescribeEveryKnownKind(t *testing.T) {
	t.Parallel()
	obs, reader, _ := newObserver(t, nil)
	ctx := context.Background()
	want := map[string]string{
		"atomicphase.reserve.created":        "{request}",
		"atomicphase.reserve.replay":         "{request}",
		"atomicphase.reserve.in_progress":    "{request}",
		"atomicphase.reserve.key_misuse":     "{request}",
		"atomicphase.reserve.failed_retry":   "{request}",
		"atomicphase.reserve.takeover":       "{request}",
		"atomicphase.reserve.over_limit":     "{request}",
		"atomicphase.store.error":            "{error}",
		"atomicphase.phase.committed":        "{phase}",
		"atomicphase.phase.failed":           "{phase}",
		"atomicphase.lock.lost":              "{attempt}",
		"atomicphase.key.parked":             "{key}",
		"atomicphase.zombie_key":             "{key}",
		"atomicphase.ttl_pruned":             "{key}",
		"atomicphase.sweep.unknown_workflow": "{key}",
		apotel.DurationMetric:                "s",
	}
	for name := range want {
		if kind, ok := strings.CutPrefix(name, apotel.MetricPrefix); ok && name != apotel.DurationMetric {
			obs.Observe(ctx, atomicphase.Event{Kind: atomicphase.EventKind(kind), Workflow: "order", Phase: "charge", Duration: 250 * time.Millisecond})
		}
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	require.Equal(t, "github.com/atomicphase/atomicphase/apotel", rm.ScopeMetrics[0].Scope.Name)
	units := map[string]string{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		units[m.Name] = m.Unit
		require.NotEmpty(t, m.Description, m.Name)
		require.NotEqual(t, "atomicphase "+strings.TrimPrefix(m.Name, apotel.MetricPrefix)+" events.", m.Description,
			"%s has the description of a kind added later", m.Name)
		if m.Name == apotel.DurationMetric {
			h := m.Data.(metricdata.Histogram[float64])
			require.Len(t, h.DataPoints, 2, "committed and failed")
			for _, p := range h.DataPoints {
				require.InDelta(t, 0.25, p.Sum, 1e-9, "seconds")
			}
		}
	}
	require.Equal(t, want, units)
}

// BenchmarkObserve measures the cost Observe adds to a request for each
// decision, against the metric SDK with a span-less context.
func BenchmarkObserve(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := apotel.New(&apotel.Options{MeterProvider: mp})
	require.NoError(b, err)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		e    atomicphase.Event
	}{
		{"reserve", atomicphase.Event{Kind: atomicphase.EventCreated, Workflow: "order", Scope: "s", Key: "k"}},
		{"phase", atomicphase.Event{Kind: atomicphase.EventPhaseCommitted, Workflow: "order", Phase: "charge", Duration: time.Millisecond}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				obs.Observe(ctx, bc.e)
			}
		})
	}
}
