package apui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The overview draws the unfinished, unknown and parked keys over the last
// hour from the samples this process read, as inline SVG: no script, and
// the content security policy as it was.
func TestOverviewChartsTheLastHour(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	fresh, err := NewHandler(&Options{Runner: b.runner})
	require.NoError(t, err)
	require.Contains(t, newRecorder(fresh, "/"), "No chart yet", "one sample (this read) is no line")

	now := time.Now()
	for i, s := range []levelSample{
		{At: now.Add(-2 * time.Hour), Unfinished: 999, Unknown: 999, Parked: 999}, // out of the window
		{At: now.Add(-50 * time.Minute), Unfinished: 9, Unknown: 3, Parked: 2},
		{At: now.Add(-20 * time.Minute), Unfinished: 12, Unknown: 2, Parked: 5},
	} {
		b.handler.samples.add(s)
		if i == 0 {
			require.Len(t, b.handler.samples.since(now.Add(-2*time.Hour)), 1)
		}
	}
	resp, err := b.client.Get(b.srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
		resp.Header.Get("Content-Security-Policy"))
	_, body := b.get(t, "/")
	require.Contains(t, body, `<svg id="levels-chart"`)
	require.NotContains(t, body, "<script")
	require.NotContains(t, body, "style=", "no inline style: the policy allows none")
	lines := regexp.MustCompile(`data-series="(\w+)" fill="none" stroke="#[0-9a-f]+" stroke-width="2" points="([^"]+)"`).FindAllStringSubmatch(body, -1)
	require.Len(t, lines, 3)
	want := map[string]int{"unfinished": 3, "unknown": 3, "parked": 3} // two planted samples, and the reads (5 s apart at least)
	for _, l := range lines {
		require.Len(t, strings.Fields(l[2]), want[l[1]], l[1])
	}
	txt := text(body)
	require.Contains(t, txt, "unfinished 6 unknown 1 parked 4", "the legend gives the levels now")
	require.Contains(t, txt, "20 10 0 an hour ago now", "the scale tops at 20 (12 rounded up), the 999s are out of the hour")
	require.Contains(t, txt, "3 samples since")
}

// SampleLevels reads the levels every interval until its context ends.
func TestSampleLevelsReadsUntilCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.handler.SampleLevels(ctx, 10*time.Millisecond) }()
	require.Eventually(t, func() bool { return len(b.handler.samples.since(time.Now())) >= 1 }, time.Minute, 10*time.Millisecond)
	cancel()
	<-done
	s := b.handler.samples.since(time.Now())
	require.Equal(t, int64(6), s[len(s)-1].Unfinished)
	require.Equal(t, int64(4), s[len(s)-1].Parked)
	require.Equal(t, int64(1), s[len(s)-1].Unknown)
	code, _ := b.get(t, "/api/levels")
	require.Equal(t, http.StatusOK, code)
}

func TestNiceCeil(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]int64{1: 1, 2: 2, 3: 5, 6: 10, 12: 20, 51: 100, 999: 1000, 1001: 2000} {
		require.Equal(t, want, niceCeil(n), n)
	}
}

// The scale's middle label is the value at its middle: 2.5 on a scale to
// 5, not 2.
func TestChartLabelsTheMiddleOfItsScale(t *testing.T) {
	t.Parallel()
	for top, want := range map[int64]string{1: "0.5", 2: "1", 5: "2.5", 10: "5", 50: "25", 500: "250"} {
		require.Equal(t, want, half(top), top)
	}
	b := setup(t, nil)
	now := time.Now()
	fresh, err := NewHandler(&Options{Runner: b.runner})
	require.NoError(t, err)
	for i, n := range []int64{1, 3, 4} {
		fresh.samples.add(levelSample{At: now.Add(time.Duration(i-3) * 10 * time.Minute), Unfinished: n})
	}
	c := chartOf(fresh.samples.since(now), now)
	require.Equal(t, int64(5), c.Max)
	rec := httptest.NewRecorder()
	require.NoError(t, fresh.pages["overview"].Execute(rec, &page{Data: &overviewData{Chart: c}}))
	require.Contains(t, text(rec.Body.String()), "5 2.5 0 an hour ago now")
}
