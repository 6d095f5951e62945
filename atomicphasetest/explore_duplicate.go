package atomicphasetest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// Duplicate is the explorer's own action (not faultinject's): at the point,
// the same request is sent a second time, concurrently, as a client whose
// first send timed out would. ExploreDuplicates runs it at every point.
const Duplicate faultinject.Action = "concurrent-duplicate"

// ExploreDuplicates sends, for every attempt × point the clean run passes,
// the same request a second time, concurrently, while the first stands at
// that point: the duplicate starts there, and the first goes on once the
// duplicate has an answer or waits on a lock the first holds. It then
// checks the scenario's invariants (one effect at the downstream, the rows
// one request makes) and that the duplicate got either the final answer,
// byte for byte (a replay, or its own run's answer when it took the key
// first), or an error its client retries (409 in progress for the loser).
// It fails t on the first violation.
func ExploreDuplicates(t *testing.T, sc Scenario) *Report {
	t.Helper()
	rep := SurveyDuplicates(t, sc)
	failOn(t, sc, rep)
	return rep
}

// SurveyDuplicates is ExploreDuplicates without failing t.
func SurveyDuplicates(t testing.TB, sc Scenario) *Report {
	t.Helper()
	e := newExplorer(t, sc)
	rep := e.newReport(sc.Name + " (concurrent duplicates)")
	rep.Coverage = Coverage{}
	if e.clean.Violation != nil {
		return rep
	}
	for k, passed := range e.attempts {
		for _, p := range uniquePoints(passed) {
			plan := make([][]Fault, k, k+1)
			plan = append(plan, []Fault{{Point: p.Point, Action: Duplicate, Attempt: k + 1}})
			row := e.run(plan)
			rep.Rows = append(rep.Rows, row)
			if row.Violation != nil {
				return rep
			}
		}
	}
	return rep
}

// dupKey marks the duplicate's context: its own passes inject nothing.
type dupKey struct{}

// duplicate is one planned concurrent duplicate.
type duplicate struct {
	point atomicphase.FaultPoint
	send  func(ctx context.Context) (*atomicphase.Response, error)
	admin *pgxpool.Pool

	once sync.Once
	done chan struct{}
	resp *atomicphase.Response
	err  error
}

// at starts the duplicate the first time the first request passes its
// point, and returns once the duplicate has an answer or is waiting on a
// lock (the first request holds it: waiting for the duplicate to finish
// would deadlock).
func (d *duplicate) at(ctx context.Context, p atomicphase.FaultPoint) {
	if d == nil || p != d.point || ctx.Value(dupKey{}) != nil {
		return
	}
	d.once.Do(func() {
		d.done = make(chan struct{})
		go func() {
			defer close(d.done)
			d.resp, d.err = d.send(context.WithValue(context.Background(), dupKey{}, true))
		}()
		// Poll until the duplicate is answered or blocked; a bound keeps a
		// duplicate stuck on anything else (the pool's connections, say)
		// from hanging the run.
		for range 5000 {
			select {
			case <-d.done:
				return
			default:
			}
			var waiting bool
			err := d.admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
			if err != nil || waiting {
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// started reports whether the duplicate was sent.
func (d *duplicate) started() bool { return d != nil && d.done != nil }

// verdict waits for the duplicate's answer and checks it against the
// request's final answer.
func (d *duplicate) verdict(final *atomicphase.Response) error {
	<-d.done
	switch {
	case d.err == nil:
		if d.resp.Status != final.Status || !bytes.Equal(d.resp.Body, final.Body) {
			return fmt.Errorf("the concurrent duplicate got %d %q, not the final answer %d %q", d.resp.Status, d.resp.Body, final.Status, final.Body)
		}
		return nil
	case atomicphase.Retryable(d.err):
		// 409 in progress (the loser), or, when the duplicate won the
		// key, what its own run met (an outcome unknown); its client
		// retries, and a retry gets the final answer (check asserts it).
		return nil
	}
	return fmt.Errorf("the concurrent duplicate got neither the final answer nor an error a client retries: %w", d.err)
}
