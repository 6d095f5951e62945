package apotel_test

import (
	"context"
	"fmt"
	"log"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// Example wires the adapter into a server's Runner. A server passes the
// providers its OpenTelemetry set-up made (exporting over OTLP, say), or nil
// Options for the global ones:
//
//	obs, err := apotel.New(nil)
//	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{Observer: obs})
//
// Here in-memory providers show what a request and its replay record.
func Example() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, nil) // a migrated database of its own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	pool := db.Pool

	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	obs, err := apotel.New(&apotel.Options{MeterProvider: meters, TracerProvider: tracers})
	if err != nil {
		log.Fatal(err)
	}
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}

	greet := atomicphase.MustWorkflow("greet",
		func(struct{}, *atomicphase.Request) (struct{}, error) { return struct{}{}, nil },
		[]atomicphase.Phase[struct{}]{
			atomicphase.Local("reply", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
				return atomicphase.Respond(200, []byte("hello")), nil
			}),
		}, nil)
	req := atomicphase.Request{Scope: "user_1", Key: "greet-1", Method: "POST", Path: "/greetings"}
	for range 2 {
		if _, err := runner.Run(ctx, greet, req); err != nil {
			log.Fatal(err)
		}
		req.Retry = true // the second is a retry, marked as aphttp's client marks it
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value))
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	for _, s := range spans.Ended() {
		fmt.Println(s.Name(), s.Parent().IsValid())
	}
	// Output:
	// atomicphase.phase.committed{phase=reply,workflow=greet} 1
	// atomicphase.reserve.created{workflow=greet} 1
	// atomicphase.reserve.replay{workflow=greet} 1
	// atomicphase.phase reply true
	// atomicphase.request false
	// atomicphase.request false
}
