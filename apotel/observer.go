package apotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase"
)

// instrumentationName names the meter and the tracer: this package.
const instrumentationName = "github.com/atomicphase/atomicphase/apotel"

// Options configure New. A nil *Options means all defaults.
type Options struct {
	// MeterProvider makes the counters and the phase duration histogram.
	// Defaults to otel.GetMeterProvider(), the global provider, which
	// forwards to a provider set later with otel.SetMeterProvider.
	MeterProvider metric.MeterProvider

	// TracerProvider makes the request and phase spans. Defaults to
	// otel.GetTracerProvider(), the global provider, which forwards to a
	// provider set later with otel.SetTracerProvider.
	TracerProvider trace.TracerProvider

	// RecordKeys adds the scope and key attributes to spans and span
	// events, as Config.RedactKey leaves them. Both are the user's data, so
	// they are left out unless asked for; they are never metric attributes,
	// whatever this says, since one value per request would make one time
	// series per request. Defaults to false.
	RecordKeys bool
}

// Observer reports a Runner's and its Sweeper's decisions as OpenTelemetry
// metrics, and its requests and phases as spans. It implements
// atomicphase.Observer; pass it as Config.Observer. Make one with New. It is
// safe for concurrent use.
type Observer struct {
	meter      metric.Meter
	tracer     trace.Tracer
	recordKeys bool

	// counters holds one counter per EventKind, made on the kind's first
	// event: kinds added to atomicphase later are counted without a change
	// here.
	counters sync.Map // atomicphase.EventKind → metric.Int64Counter
	duration metric.Float64Histogram
}

var _ atomicphase.Observer = (*Observer)(nil)

// New returns an Observer that records through the providers opts names.
// It makes the instruments of the known event kinds and the duration
// histogram at once, so that a provider refusing them is an error here
// rather than a silent gap; the error joins every refusal. opts may be nil
// for the defaults.
func New(opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	obs := &Observer{
		meter:      o.MeterProvider.Meter(instrumentationName),
		tracer:     o.TracerProvider.Tracer(instrumentationName),
		recordKeys: o.RecordKeys,
	}
	var errs []error
	var err error
	if obs.duration, err = newDurationHistogram(obs.meter); err != nil {
		errs = append(errs, err)
	}
	for _, kind := range knownKinds() {
		c, err := newCounter(obs.meter, kind)
		if err != nil {
			errs = append(errs, err)
		}
		obs.counters.Store(kind, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return obs, nil
}

// Observe counts the decision e and adds it as an event to the innermost
// open span this Observer started for the request (or, outside a request,
// to the span ctx carries, if it records).
func (o *Observer) Observe(ctx context.Context, e atomicphase.Event) {
	o.count(ctx, e)
	o.addEvent(ctx, e)
}
