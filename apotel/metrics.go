package apotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/atomicphase/atomicphase"
)

// MetricPrefix starts every metric name and span event name: the metric of
// an event kind is MetricPrefix + the kind, "atomicphase.reserve.created"
// say.
const MetricPrefix = "atomicphase."

// DurationMetric is the histogram of phase durations, in seconds.
const DurationMetric = MetricPrefix + "phase.duration"

// knownKinds are the event kinds whose counters New makes up front. A kind
// not listed gets its counter on its first event.
func knownKinds() []atomicphase.EventKind {
	return []atomicphase.EventKind{
		atomicphase.EventCreated, atomicphase.EventReplay, atomicphase.EventInProgress,
		atomicphase.EventKeyMisuse, atomicphase.EventFailedRetry, atomicphase.EventTakeover,
		atomicphase.EventOverLimit, atomicphase.EventStoreError,
		atomicphase.EventPhaseCommitted, atomicphase.EventPhaseFailed,
		atomicphase.EventLockLost, atomicphase.EventParked, atomicphase.EventParkedReaped,
		atomicphase.EventParkedRefused, atomicphase.EventDataRefused,
		atomicphase.EventZombieKey, atomicphase.EventTTLPruned, atomicphase.EventUnknownWorkflow,
	}
}

// describe returns the unit and description of kind's counter; the package
// documentation says the same at more length.
func describe(kind atomicphase.EventKind) (unit, description string) {
	switch kind {
	case atomicphase.EventCreated:
		return "{request}", "New idempotency keys recorded; their first attempt began."
	case atomicphase.EventReplay:
		return "{request}", "Requests answered with a finished key's stored response."
	case atomicphase.EventInProgress:
		return "{request}", "Requests refused because another attempt holds the key (409)."
	case atomicphase.EventKeyMisuse:
		return "{request}", "Requests refused because their key was first used with another request (422)."
	case atomicphase.EventFailedRetry:
		return "{request}", "Unfinished keys no attempt held, taken by a client retry or a resume."
	case atomicphase.EventTakeover:
		return "{request}", "Keys taken over from an attempt whose lock had gone stale."
	case atomicphase.EventOverLimit:
		return "{request}", "New keys refused because their scope has too many unfinished keys (429)."
	case atomicphase.EventStoreError:
		return "{error}", "Key store statements that failed."
	case atomicphase.EventPhaseCommitted:
		return "{phase}", "Phases committed."
	case atomicphase.EventPhaseFailed:
		return "{phase}", "Phases failed and rolled back."
	case atomicphase.EventLockLost:
		return "{attempt}", "Attempts that found at commit that a newer attempt had taken their key."
	case atomicphase.EventParked:
		return "{key}", "Keys parked for an operator."
	case atomicphase.EventParkedReaped:
		return "{key}", "Parked keys the sweep deleted after their retention."
	case atomicphase.EventParkedRefused:
		return "{request}", "Retries of parked keys, answered with their failure (500) without running anything."
	case atomicphase.EventDataRefused:
		return "{request}", "Requests whose data the database refused, finished with a stored 422."
	case atomicphase.EventZombieKey:
		return "{key}", "Abandoned keys the sweep completed."
	case atomicphase.EventTTLPruned:
		return "{key}", "Finished keys the sweep deleted after their retention."
	case atomicphase.EventUnknownWorkflow:
		return "{key}", "Abandoned keys of unregistered workflows, as many as each sweep saw."
	default:
		return "{event}", fmt.Sprintf("atomicphase %s events.", kind)
	}
}

// newCounter makes kind's counter. It never returns nil: a provider that
// refuses the instrument gets a no-op counter in its place.
func newCounter(m metric.Meter, kind atomicphase.EventKind) (metric.Int64Counter, error) {
	unit, desc := describe(kind)
	c, err := m.Int64Counter(MetricPrefix+string(kind), metric.WithUnit(unit), metric.WithDescription(desc))
	if c == nil {
		c = noop.Int64Counter{}
	}
	if err != nil {
		err = fmt.Errorf("apotel: counter for %s: %w", kind, err)
	}
	return c, err
}

// newDurationHistogram makes the phase duration histogram. Its buckets
// span a local phase's milliseconds to a slow foreign call's tens of
// seconds; OpenTelemetry's default buckets are meant for milliseconds.
func newDurationHistogram(m metric.Meter) (metric.Float64Histogram, error) {
	h, err := m.Float64Histogram(DurationMetric, metric.WithUnit("s"),
		metric.WithDescription("Time a phase took, foreign call and transaction retries included."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	if h == nil {
		h = noop.Float64Histogram{}
	}
	if err != nil {
		err = fmt.Errorf("apotel: histogram %s: %w", DurationMetric, err)
	}
	return h, err
}

// counter returns kind's counter, making it on the kind's first event. A
// provider's refusal goes to the OpenTelemetry error handler, since Observe
// has nobody to return it to.
func (o *Observer) counter(kind atomicphase.EventKind) metric.Int64Counter {
	if c, ok := o.counters.Load(kind); ok {
		return c.(metric.Int64Counter)
	}
	c, err := newCounter(o.meter, kind)
	if err != nil {
		otel.Handle(err)
	}
	// Two first events may race; both get the counter stored first.
	actual, _ := o.counters.LoadOrStore(kind, c)
	return actual.(metric.Int64Counter)
}

// phaseOutcome returns the outcome attribute of a phase event's duration,
// and whether e is one.
func phaseOutcome(kind atomicphase.EventKind) (string, bool) {
	switch kind {
	case atomicphase.EventPhaseCommitted:
		return "committed", true
	case atomicphase.EventPhaseFailed:
		return "failed", true
	}
	return "", false
}

// count adds e to its kind's counter, by e.Count for an event about many
// keys and by one otherwise, and records a phase's duration.
func (o *Observer) count(ctx context.Context, e atomicphase.Event) {
	attrs := make([]attribute.KeyValue, 0, 3) // workflow, phase, outcome
	attrs = appendMetricAttrs(attrs, e)
	n := int64(1)
	if e.Count > 0 {
		n = int64(e.Count)
	}
	o.counter(e.Kind).Add(ctx, n, metric.WithAttributes(attrs...))
	if outcome, ok := phaseOutcome(e.Kind); ok {
		attrs = append(attrs, AttrOutcome.String(outcome))
		o.duration.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(attrs...))
	}
}
