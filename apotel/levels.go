package apotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/atomicphase/atomicphase"
)

// Levels: how many unfinished keys stand where now, as observable gauges.
// The counters count transitions, so a dashboard restarted after an
// incident shows nothing until the next one; a gauge reads the level
// itself, from the key table, whenever the metrics are collected.

// The gauges RegisterLevels registers.
const (
	// LevelsMetric is the number of unfinished keys, by workflow and
	// status (in_progress, stale, abandoned, unknown, parked).
	LevelsMetric = MetricPrefix + "keys.unfinished"
	// OldestMetric is the age of the oldest unfinished key, in seconds, by
	// workflow and status.
	OldestMetric = MetricPrefix + "keys.oldest_age"
)

// LevelsOptions configure RegisterLevels. A nil *LevelsOptions means all
// defaults.
type LevelsOptions struct {
	// MeterProvider makes the gauges. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// MinInterval is the least time between two reads of the key table:
	// a collection sooner than that after the last read reports what it
	// read, so several readers, or a short collection interval, cost one
	// query per MinInterval. Defaults to 15 seconds.
	MinInterval time.Duration
	// Timeout bounds one read of the key table. Defaults to 5 seconds.
	Timeout time.Duration
}

// levels is the state of the gauges' callback.
type levels struct {
	runner      *atomicphase.Runner
	minInterval time.Duration
	timeout     time.Duration

	mu       sync.Mutex
	readAt   time.Time
	last     []atomicphase.KeyLevel
	lastErr  error
	reported map[[2]string]bool // (workflow, status) reported before: reported 0 once gone
}

// RegisterLevels registers gauges of the levels of runner's unfinished
// keys: LevelsMetric (how many, unit {key}) and OldestMetric (the oldest's
// age, unit s), each with the attributes workflow and status. They are read
// with Runner.KeyLevels, one query over the unfinished keys, at most
// once per MinInterval however often the metrics are collected. A level
// that drops to nothing is reported as 0 (and its age as 0), so that it
// does not stay at its last value. Unregister the returned registration to
// stop.
func RegisterLevels(runner *atomicphase.Runner, opts *LevelsOptions) (metric.Registration, error) {
	if runner == nil {
		return nil, errors.New("apotel: RegisterLevels needs the Runner of the key table to read")
	}
	var o LevelsOptions
	if opts != nil {
		o = *opts
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 15 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	m := o.MeterProvider.Meter(instrumentationName)
	count, err := m.Int64ObservableGauge(LevelsMetric, metric.WithUnit("{key}"),
		metric.WithDescription("Unfinished idempotency keys now, by workflow and status."))
	if err != nil {
		return nil, err
	}
	oldest, err := m.Float64ObservableGauge(OldestMetric, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished idempotency key now, by workflow and status."))
	if err != nil {
		return nil, err
	}
	l := &levels{runner: runner, minInterval: o.MinInterval, timeout: o.Timeout, reported: map[[2]string]bool{}}
	return m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		rows, err := l.read(ctx)
		if err != nil {
			return err
		}
		now := time.Now()
		seen := map[[2]string]bool{}
		for _, row := range rows {
			k := [2]string{row.Workflow, string(row.Status)}
			seen[k] = true
			attrs := metric.WithAttributes(attribute.String("workflow", row.Workflow), attribute.String("status", string(row.Status)))
			obs.ObserveInt64(count, row.Count, attrs)
			obs.ObserveFloat64(oldest, max(now.Sub(row.Oldest).Seconds(), 0), attrs)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for k := range l.reported {
			if !seen[k] {
				attrs := metric.WithAttributes(attribute.String("workflow", k[0]), attribute.String("status", k[1]))
				obs.ObserveInt64(count, 0, attrs)
				obs.ObserveFloat64(oldest, 0, attrs)
			}
		}
		for k := range seen {
			l.reported[k] = true
		}
		return nil
	}, count, oldest)
}

// read returns the levels, read again only when the last read is older
// than minInterval.
func (l *levels) read(ctx context.Context) ([]atomicphase.KeyLevel, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.readAt.IsZero() && time.Since(l.readAt) < l.minInterval {
		return l.last, l.lastErr
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	l.last, l.lastErr = l.runner.KeyLevels(ctx, nil)
	l.readAt = time.Now()
	return l.last, l.lastErr
}
