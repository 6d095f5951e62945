package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase"
)

// -diagnose: where a measurement's slow requests wait. While a design
// runs, every node's pg_stat_activity is sampled every sampleEvery: each
// sample counts the application's backends that are not idle (those idle
// in a transaction included), by state and wait event ("running" when
// PostgreSQL reports none: on a CPU, or in a wait it does not report). The
// Runner's log records (phase retries, takeovers, lost locks) are counted
// by message and error, and each request's moments are timed. All are
// printed after the measurement. The sampling costs each node a query
// every sampleEvery, and atomicphase's Runner an Observer: compare
// -diagnose runs with each other.

// sampleEvery is how often -diagnose samples each node.
const sampleEvery = 10 * time.Millisecond

// samplerApp is the application_name of -diagnose's own connections,
// which the samples leave out.
const samplerApp = "bench-scale-sampler"

// waitsSQL lists the application's busy backends by state and wait event.
const waitsSQL = `SELECT state, coalesce(wait_event_type || ':' || wait_event, 'running') AS wait, count(*)::int
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND datname = current_database()
  AND state IS DISTINCT FROM 'idle' AND application_name <> '` + samplerApp + `'
GROUP BY 1, 2`

// waitCount is one node's samples of one (state, wait event).
type waitCount struct {
	node, state, wait string
	backends          int64
}

// sampler samples every node's wait events until stopped.
type sampler struct {
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	counts  map[waitCount]int64 // backends seen, summed over the samples
	samples map[string]int      // samples taken, by node
	errs    []error
}

// startSampler starts sampling c's nodes.
func startSampler(ctx context.Context, c *cluster) (*sampler, error) {
	ctx, stop := context.WithCancel(ctx)
	s := &sampler{stop: stop, counts: map[waitCount]int64{}, samples: map[string]int{}}
	for i, n := range c.nodes {
		cfg, err := pgx.ParseConfig(n.URL)
		if err != nil {
			stop()
			s.wg.Wait()
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = samplerApp
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			stop()
			s.wg.Wait()
			return nil, err
		}
		name := c.nodeName(i)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close(context.WithoutCancel(ctx))
			t := time.NewTicker(sampleEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				rows, err := conn.Query(ctx, waitsSQL)
				if err != nil {
					if ctx.Err() == nil {
						s.mu.Lock()
						s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
						s.mu.Unlock()
					}
					return
				}
				var seen []waitCount
				for rows.Next() {
					var w waitCount
					if err := rows.Scan(&w.state, &w.wait, &w.backends); err != nil {
						break
					}
					w.node = name
					seen = append(seen, w)
				}
				rows.Close()
				if rows.Err() != nil {
					continue
				}
				s.mu.Lock()
				s.samples[name]++
				for _, w := range seen {
					n := w.backends
					w.backends = 0
					s.counts[w] += n
				}
				s.mu.Unlock()
			}
		}()
	}
	return s, nil
}

// print stops the sampler and prints, per node, the busy backends' states
// and wait events: the mean number of backends in each per sample, and its
// share of all busy backends seen.
func (s *sampler) print(out io.Writer, nodes []string) {
	s.stop()
	s.wg.Wait()
	fmt.Fprintf(out, "    wait events (mean backends per %s sample, share of the node's busy backends):\n", sampleEvery)
	for _, node := range nodes {
		var rows []waitCount
		var total int64
		for w, n := range s.counts {
			if w.node == node {
				w.backends = n
				rows = append(rows, w)
				total += n
			}
		}
		if s.samples[node] == 0 || total == 0 {
			fmt.Fprintf(out, "      %s: no busy backend seen\n", node)
			continue
		}
		slices.SortFunc(rows, func(a, b waitCount) int { return int(b.backends - a.backends) })
		var parts []string
		for i, w := range rows {
			if i == 6 {
				break
			}
			parts = append(parts, fmt.Sprintf("%s %s %.1f (%.0f%%)", w.state, w.wait,
				float64(w.backends)/float64(s.samples[node]), 100*float64(w.backends)/float64(total)))
		}
		fmt.Fprintf(out, "      %s (%d samples, %.1f busy): %s\n", node, s.samples[node],
			float64(total)/float64(s.samples[node]), strings.Join(parts, "; "))
	}
	for _, err := range s.errs {
		fmt.Fprintf(out, "      sampling stopped: %v\n", err)
	}
}

// runnerLog counts every Runner's log records; -diagnose prints them.
var runnerLog = newLogCounter()

// logCounter is a slog.Handler counting the Runner's log records by
// message and error, for -diagnose.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func newLogCounter() *logCounter { return &logCounter{counts: map[string]int{}} }

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	what := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			msg := a.Value.String()
			if len(msg) > 120 {
				msg = msg[:120] + "…"
			}
			what += ": " + msg
			return false
		}
		return true
	})
	l.mu.Lock()
	l.counts[what]++
	l.mu.Unlock()
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

// take returns the counts since the last take, most frequent first, and
// starts counting afresh.
func (l *logCounter) take() []string {
	l.mu.Lock()
	counts := l.counts
	l.counts = map[string]int{}
	l.mu.Unlock()
	var lines []string
	for what, n := range counts {
		lines = append(lines, fmt.Sprintf("%7d  %s", n, what))
	}
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(b, a) })
	return lines
}

// timeline is one request's moments, for -diagnose: when it began, when
// its first commit (the key and the ride) returned, when the payment call
// began and ended, and when it was answered.
type timeline struct {
	start, first, callStart, callEnd, end time.Time
}

type timelineKey struct{}

// withTimeline returns ctx carrying tl.
func withTimeline(ctx context.Context, tl *timeline) context.Context {
	return context.WithValue(ctx, timelineKey{}, tl)
}

// mark sets *at to now when ctx carries a timeline (at picks its field).
func mark(ctx context.Context, at func(*timeline) *time.Time) {
	if tl, ok := ctx.Value(timelineKey{}).(*timeline); ok {
		*at(tl) = time.Now()
	}
}

// firstCommitObserver marks a request's first commit: the end of the
// atomicphase workflow's first phase, whose unit records the key and the
// ride.
type firstCommitObserver struct{}

func (firstCommitObserver) Observe(context.Context, atomicphase.Event) {}

func (firstCommitObserver) StartSpan(ctx context.Context, s atomicphase.Span) (context.Context, func(error)) {
	if s.Kind != atomicphase.SpanPhase || s.Phase != "create_ride" {
		return ctx, func(error) {}
	}
	return ctx, func(error) { mark(ctx, func(t *timeline) *time.Time { return &t.first }) }
}

// printTimelines prints where the requests' time went, for all of them and
// for the slowest 1%: the mean of each stretch between their moments.
func printTimelines(out io.Writer, tls []*timeline) {
	if len(tls) == 0 {
		return
	}
	slices.SortFunc(tls, func(a, b *timeline) int { return cmp.Compare(a.end.Sub(a.start), b.end.Sub(b.start)) })
	// A request whose moments were not all marked (none is, today: every
	// answered request passes each) is left out rather than counted as
	// stretches from the zero time.
	tls = slices.DeleteFunc(tls, func(t *timeline) bool {
		return t.first.IsZero() || t.callStart.IsZero() || t.callEnd.IsZero() || t.end.IsZero()
	})
	if len(tls) == 0 {
		return
	}
	line := func(what string, tls []*timeline) {
		var first, gap, call, last, total time.Duration
		for _, t := range tls {
			first += t.first.Sub(t.start)
			gap += t.callStart.Sub(t.first)
			call += t.callEnd.Sub(t.callStart)
			last += t.end.Sub(t.callEnd)
			total += t.end.Sub(t.start)
		}
		n := time.Duration(len(tls))
		fmt.Fprintf(out, "      %-16s %7d  first commit %8s  then to the call %8s  call %8s  last commit %8s  total %8s\n",
			what, len(tls), ms(first/n), ms(gap/n), ms(call/n), ms(last/n), ms(total/n))
	}
	fmt.Fprintln(out, "    where the time went (mean per request):")
	line("all", tls)
	line("slowest 1%", tls[len(tls)-max(1, len(tls)/100):])
}
