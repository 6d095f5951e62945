package apotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// gauges collects the level gauges: name → encoded attributes → value (the
// age gauge as whether it is positive).
func gauges(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	enc := attribute.DefaultEncoder()
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			points := map[string]int64{}
			switch data := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					points[p.Attributes.Encoded(enc)] = p.Value
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					if p.Value > 0 {
						points[p.Attributes.Encoded(enc)] = 1
					} else {
						points[p.Attributes.Encoded(enc)] = 0
					}
				}
			}
			out[m.Name] = points
		}
	}
	return out
}

// A dashboard started after the keys were parked sees them at once: the
// gauges read the level, not the transitions. They read the table at most
// once per MinInterval, and a level that empties is reported as 0.
func TestLevelsGaugesReadTheKeyTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := atomicphasetest.NewDB(t, nil)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	type state struct{}
	wf := atomicphase.MustWorkflow("payout", func(struct{}, *atomicphase.Request) (state, error) { return state{}, nil },
		[]atomicphase.Phase[state]{atomicphase.Local("pay", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("account closed"))
		})}, nil)
	park := func(key string) {
		_, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "s", Key: key, Method: "POST", Path: "/p"})
		require.ErrorIs(t, err, atomicphase.ErrPermanent)
	}
	park("a")
	park("b")

	register := func(minInterval time.Duration) *sdkmetric.ManualReader {
		reader := sdkmetric.NewManualReader()
		reg, err := apotel.RegisterLevels(runner, &apotel.LevelsOptions{
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), MinInterval: minInterval})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, reg.Unregister()) })
		return reader
	}
	const parked = "status=parked,workflow=payout"
	cached, fresh := register(time.Hour), register(time.Nanosecond)
	require.Equal(t, map[string]map[string]int64{apotel.LevelsMetric: {parked: 2}, apotel.OldestMetric: {parked: 1}}, gauges(t, cached))
	require.Equal(t, int64(2), gauges(t, fresh)[apotel.LevelsMetric][parked])

	park("c")
	require.Equal(t, int64(2), gauges(t, cached)[apotel.LevelsMetric][parked], "read once per MinInterval: the last read is reported")
	require.Equal(t, int64(3), gauges(t, fresh)[apotel.LevelsMetric][parked])

	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, runner.Forget(ctx, "s", k))
	}
	require.Equal(t, map[string]map[string]int64{apotel.LevelsMetric: {parked: 0}, apotel.OldestMetric: {parked: 0}}, gauges(t, fresh),
		"an emptied level reads 0, not its last value")

	_, err = apotel.RegisterLevels(nil, nil)
	require.ErrorContains(t, err, "needs the Runner")
}
