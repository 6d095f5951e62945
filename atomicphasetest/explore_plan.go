package atomicphasetest

import (
	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// The plans Survey runs, and the coverage it reports. A plan lists, per
// attempt, the faults injected on it; the attempts before the first faulted
// one run cleanly, so they take the clean run's path, and the faulted
// attempt passes the points the clean run's attempt passed up to the fault.

// Why a fault is not planned or not run (Coverage.Skipped's keys).
const (
	SkipNoConn      = "no connection held there"
	SkipNoCommit    = "no commit follows"
	SkipNoTake      = "no statement takes the key there"
	SkipNoCall      = "no foreign call there"
	SkipNoHTTP      = "no HTTP transport from the trial (Trial.HTTP)"
	SkipNotReached  = "the attempt never reached the point"
	SkipNotRepassed = "the retry does not pass the point again"
)

// skipReasons lists the reasons in the order the report prints them.
var skipReasons = []string{SkipNoConn, SkipNoCommit, SkipNoTake, SkipNoCall, SkipNoHTTP, SkipNotReached, SkipNotRepassed}

// newReport starts a report with the clean run.
func (e *explorer) newReport(name string) *Report {
	rep := &Report{Scenario: name, Attempts: e.attempts, Coverage: Coverage{Skipped: map[string]int{}}}
	for _, passed := range e.attempts {
		rep.Points = append(rep.Points, passed...)
	}
	rep.Rows = append(rep.Rows, e.clean)
	for k, passed := range e.attempts {
		rep.Coverage.Attempts = append(rep.Coverage.Attempts, AttemptCoverage{
			Attempt: k + 1, Points: len(uniquePoints(passed)), Actions: len(e.actions), Skipped: map[string]int{},
		})
	}
	return rep
}

// exhaust runs, for every attempt of the clean run, every point it passed
// with every applicable action; after each plan that made the run retry
// past the faulted attempt, the plans faulting the following attempts at
// the same point (up to Scenario.Consecutive attempts in all). It stops at
// the first violation.
func (e *explorer) exhaust(rep *Report) {
	for k, passed := range e.attempts {
		cov := &rep.Coverage.Attempts[k]
		for _, p := range uniquePoints(passed) {
			for _, action := range e.actions {
				if skip := e.skipReason(action, p); skip != "" {
					cov.Skipped[skip]++
					continue
				}
				f := Fault{Point: p.Point, Action: action, Attempt: k + 1}
				plan := make([][]Fault, k, k+e.sc.Consecutive)
				plan = append(plan, []Fault{f})
				row := e.run(plan)
				rep.Rows = append(rep.Rows, row)
				if len(row.Unfired) > 0 {
					cov.Skipped[SkipNotReached]++
				} else {
					cov.Run++
				}
				if row.Violation != nil {
					return
				}
				if !e.consecutive(rep, plan, row) {
					return
				}
			}
		}
	}
}

// consecutive extends a plan whose fault fired, attempt by attempt, while
// the retry passes the faulted point again; it reports false at a
// violation.
func (e *explorer) consecutive(rep *Report, plan [][]Fault, row Row) bool {
	f := plan[len(plan)-1][0]
	for len(plan) < f.Attempt-1+e.sc.Consecutive {
		if len(row.Unfired) > 0 || f.Action == faultinject.Delay || f.Action == faultinject.SlowCall {
			return true // nothing failed: the retry is the clean run's
		}
		next := len(plan) // the retry's index in row.passed
		if next >= len(row.passed) || !passes(row.passed[next], f.Point) {
			rep.Coverage.Skipped[SkipNotRepassed]++
			return true
		}
		g := f
		g.Attempt = next + 1
		plan = append(plan, []Fault{g})
		row = e.run(plan)
		rep.Rows = append(rep.Rows, row)
		if len(row.Unfired) > 0 {
			rep.Coverage.Skipped[SkipNotReached]++
		} else {
			rep.Coverage.Consecutive++
		}
		if row.Violation != nil {
			return false
		}
	}
	return true
}

func passes(passed []faultinject.Passed, p atomicphase.FaultPoint) bool {
	for _, q := range passed {
		if q.Point == p {
			return true
		}
	}
	return false
}

// uniquePoints is passed with each point once, in the order first passed;
// a point passed both without a connection and with one (BeforeAcquire on a
// request not marked as a retry whose key exists: before the first unit's
// batch, then before the take) holds one, as an action that needs it fires
// where the attempt holds it (faultinject.Injector).
func uniquePoints(passed []faultinject.Passed) []faultinject.Passed {
	var out []faultinject.Passed
	at := map[atomicphase.FaultPoint]int{}
	for _, p := range passed {
		n, seen := at[p.Point]
		switch {
		case !seen:
			at[p.Point] = len(out)
			out = append(out, p)
		case p.HasConn:
			out[n].HasConn = true
		}
	}
	return out
}

// skipReason says why an action can do nothing at a point, or "" when it
// applies: TerminateBackend needs a held connection, LoseCommitAck a
// commit to come, LoseTakeAck the statement that takes the key,
// SlowCall a foreign call that returned, DropAfterRequest a foreign
// phase about to start and the trial's HTTP transport.
func (e *explorer) skipReason(a faultinject.Action, p faultinject.Passed) string {
	if a.NeedsConn() && !p.HasConn {
		return SkipNoConn
	}
	switch a {
	case faultinject.LoseCommitAck:
		if p.Point.Place != atomicphase.BeforeCommit {
			return SkipNoCommit
		}
	case faultinject.LoseTakeAck:
		if p.Point.Place != atomicphase.BeforeAcquire {
			return SkipNoTake
		}
	case faultinject.SlowCall:
		if p.Point.Place != atomicphase.AfterForeign {
			return SkipNoCall
		}
	case faultinject.DropAfterRequest:
		if p.Point.Place != atomicphase.BeforePhase || !e.foreign[p.Point.Phase] {
			return SkipNoCall
		}
		if !e.http {
			return SkipNoHTTP
		}
	}
	return ""
}
