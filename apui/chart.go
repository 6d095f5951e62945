package apui

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase"
)

// The overview's chart: the unfinished, unknown and parked keys over the
// last hour. The key table keeps no history of its levels (a key's row
// holds where it stands now, not where it stood), so the samples come from
// this process: each time it reads the levels (an overview, api/levels),
// and every interval while Handler.SampleLevels runs (atomicphase ui runs
// it). A console that has not run for the hour shows what it has; the
// chart says since when. Drawn on the server as inline SVG: no script, and
// the content security policy stays default-src 'none'.

// chartWindow is how far back the chart reaches; sampleGap the least time
// between two samples kept (a later one in the gap replaces the earlier).
const (
	chartWindow = time.Hour
	sampleGap   = 5 * time.Second
)

// levelSample is the levels at one time.
type levelSample struct {
	At                          time.Time
	Unfinished, Unknown, Parked int64
}

// levelSamples are the samples of the last chartWindow, oldest first.
type levelSamples struct {
	mu      sync.Mutex
	samples []levelSample
}

// add records s, dropping what is older than the window.
func (l *levelSamples) add(s levelSample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.samples); n > 0 && s.At.Sub(l.samples[n-1].At) < sampleGap {
		if s.At.Before(l.samples[n-1].At) {
			return
		}
		l.samples[n-1] = s
	} else {
		l.samples = append(l.samples, s)
	}
	cut := 0
	for cut < len(l.samples) && s.At.Sub(l.samples[cut].At) > chartWindow {
		cut++
	}
	l.samples = append(l.samples[:0], l.samples[cut:]...)
}

// since returns a copy of the samples no older than the window before now.
func (l *levelSamples) since(now time.Time) []levelSample {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []levelSample
	for _, s := range l.samples {
		if now.Sub(s.At) <= chartWindow {
			out = append(out, s)
		}
	}
	return out
}

// sampleOf is the sample of levels read at t.
func sampleOf(t time.Time, levels []atomicphase.KeyLevel) levelSample {
	s := levelSample{At: t}
	for _, l := range levels {
		s.Unfinished += l.Count
		switch l.Status {
		case atomicphase.KeyUnknown:
			s.Unknown += l.Count
		case atomicphase.KeyParked:
			s.Parked += l.Count
		}
	}
	return s
}

// SampleLevels reads the levels of the unfinished keys every interval (30s
// when interval <= 0) until ctx ends, for the overview's chart of the last
// hour; a read that fails is skipped. Each read is what an overview costs
// in KeyLevels (docs/console.md gives it on a large table). Run it in a
// goroutine of the process that serves the console; without it the chart
// has a sample only when someone reads the levels.
func (h *Handler) SampleLevels(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if levels, err := h.opts.Runner.KeyLevels(ctx, nil); err == nil {
			h.samples.add(sampleOf(time.Now(), levels))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// levelChart is the overview's chart, ready to draw.
type levelChart struct {
	// Series are the three lines; Max is the top of the scale.
	Series []chartSeries
	Max    int64
	// Since is when the first sample shown was read; Samples how many.
	Since   time.Time
	Samples int
}

// chartSeries is one line of the chart.
type chartSeries struct {
	Name    string
	Color   string
	Points  string // the polyline's points, in the chart's coordinates
	Last    int64
	LegendX int
}

// The chart's size, in SVG units: the plot spans x from chartLeft to
// chartWidth and y from chartTop to chartBottom.
const (
	chartWidth  = 640
	chartLeft   = 44
	chartTop    = 10
	chartBottom = 110
)

// chartOf draws the samples of the hour before now; nil without two.
func chartOf(samples []levelSample, now time.Time) *levelChart {
	if len(samples) < 2 {
		return nil
	}
	c := &levelChart{Since: samples[0].At, Samples: len(samples), Max: 1}
	for _, s := range samples {
		c.Max = max(c.Max, s.Unfinished, s.Unknown, s.Parked)
	}
	c.Max = niceCeil(c.Max)
	x := func(t time.Time) float64 {
		return chartLeft + float64(chartWidth-chartLeft)*(1-now.Sub(t).Seconds()/chartWindow.Seconds())
	}
	y := func(v int64) float64 {
		return chartBottom - float64(chartBottom-chartTop)*float64(v)/float64(c.Max)
	}
	line := func(name, color string, v func(levelSample) int64, legend int) chartSeries {
		var b strings.Builder
		for i, s := range samples {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(s.At), y(v(s)))
		}
		return chartSeries{Name: name, Color: color, Points: b.String(), Last: v(samples[len(samples)-1]), LegendX: legend}
	}
	c.Series = []chartSeries{
		line("unfinished", "#2453c9", func(s levelSample) int64 { return s.Unfinished }, chartLeft),
		line("unknown", "#b7791f", func(s levelSample) int64 { return s.Unknown }, chartLeft+170),
		line("parked", "#c53030", func(s levelSample) int64 { return s.Parked }, chartLeft+320),
	}
	return c
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten, for the scale.
func niceCeil(n int64) int64 {
	p := int64(1)
	for {
		for _, m := range []int64{1, 2, 5} {
			if m*p >= n {
				return m * p
			}
		}
		p *= 10
	}
}

// half is half the scale's top, for its middle label, exactly: the
// middle of a scale to 5 is 2.5, not 2.
func half(n int64) string {
	if n%2 == 0 {
		return strconv.FormatInt(n/2, 10)
	}
	return strconv.FormatInt(n/2, 10) + ".5"
}
