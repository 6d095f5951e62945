package atomicphasetest

import (
	"bytes"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// Row is one explored run.
type Row struct {
	// Faults lists the faults injected, one per faulted attempt.
	Faults []Fault
	// Attempts is how many times the request was sent.
	Attempts int
	// Outcome is the final answer ("201") or why there was none.
	Outcome string
	// Violation is the invariant that failed, or nil.
	Violation error
	// Unfired lists the planned faults that never fired: the attempt took
	// another path than the clean run's, or ended before the point.
	Unfired []Fault

	// passed are the points each attempt passed.
	passed [][]faultinject.Passed
}

// Fault is an action at a point.
type Fault struct {
	// Point is where the fault was injected.
	Point atomicphase.FaultPoint
	// Action is what was done there.
	Action faultinject.Action
	// Attempt is the attempt it was injected on, 1 for the first; 0 reads
	// as 1.
	Attempt int
}

// String renders the fault as "workflow:phase:place action", with
// " on attempt N" after the first attempt.
func (f Fault) String() string {
	s := f.Point.String() + " " + string(f.Action)
	if f.Attempt > 1 {
		s += fmt.Sprintf(" on attempt %d", f.Attempt)
	}
	return s
}

// where renders the fault's point for the report's table: "point", or
// "point@N" after the first attempt.
func (f Fault) where() string {
	if f.Attempt > 1 {
		return fmt.Sprintf("%s@%d", f.Point, f.Attempt)
	}
	return f.Point.String()
}

// Report is the result of an exploration.
type Report struct {
	// Scenario is the scenario's name (and, for a random exploration, its
	// seed).
	Scenario string
	// Points are the fault points the clean run passed, in order, every
	// attempt's.
	Points []faultinject.Passed
	// Attempts are the points each attempt of the clean run passed.
	Attempts [][]faultinject.Passed
	// Coverage counts what Survey explored and what it skipped, and why.
	// A random exploration leaves it empty.
	Coverage Coverage
	// Rows are the runs: the clean run first, then one per fault plan, up
	// to and including the first that violated an invariant.
	Rows []Row
}

// Violation returns the first run that violated an invariant, or nil.
func (r *Report) Violation() *Row {
	for i := range r.Rows {
		if r.Rows[i].Violation != nil {
			return &r.Rows[i]
		}
	}
	return nil
}

// String renders the report as a table: point, action, attempts, final
// outcome, invariant.
func (r *Report) String() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "fault exploration %q: %d points, %d runs\n", r.Scenario, len(r.Points), len(r.Rows))
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "POINT\tACTION\tATTEMPTS\tOUTCOME\tINVARIANT")
	for _, row := range r.Rows {
		verdict := "ok"
		if row.Violation != nil {
			verdict = "VIOLATED: " + row.Violation.Error()
		}
		points, actions := "(none)", "-"
		if len(row.Faults) > 0 {
			var ps, as []string
			for _, f := range row.Faults {
				ps, as = append(ps, f.where()), append(as, string(f.Action))
			}
			points, actions = strings.Join(ps, " → "), strings.Join(as, " → ")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", points, actions, row.Attempts, row.Outcome, verdict)
	}
	_ = w.Flush()
	if len(r.Coverage.Attempts) > 0 && len(r.Rows) > 1 {
		b.WriteString(r.Coverage.String())
	}
	return b.String()
}

// Coverage is what an exhaustive exploration covered: per attempt of the
// clean run, its points × actions, how many of those ran and why the others
// did not; and the plans that faulted consecutive attempts.
type Coverage struct {
	// Attempts has one entry per attempt of the clean run.
	Attempts []AttemptCoverage
	// Consecutive counts the plans run that faulted two or more
	// consecutive attempts at the same point, every fault firing.
	Consecutive int
	// Skipped counts the consecutive plans not run, by reason.
	Skipped map[string]int
}

// AttemptCoverage is the coverage of one attempt of the clean run.
type AttemptCoverage struct {
	// Attempt is the attempt, 1 for the first.
	Attempt int
	// Points is how many distinct fault points the attempt passed.
	Points int
	// Actions is how many actions were tried at each.
	Actions int
	// Run counts the point × action plans run whose fault fired.
	Run int
	// Skipped counts the others, by reason (the Skip constants).
	Skipped map[string]int
}

// String renders the coverage as a table: attempt, points, actions, their
// product, runs, and the skipped ones with their reasons.
func (c Coverage) String() string {
	var b bytes.Buffer
	b.WriteString("coverage:\n")
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ATTEMPT\tPOINTS\tACTIONS\tPOINTS×ACTIONS\tRUN\tSKIPPED")
	total := 0
	for _, a := range c.Attempts {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\n", a.Attempt, a.Points, a.Actions, a.Points*a.Actions, a.Run, skipped(a.Skipped))
		total += a.Run
	}
	fmt.Fprintf(w, "consecutive\t-\t-\t-\t%d\t%s\n", c.Consecutive, skipped(c.Skipped))
	fmt.Fprintf(w, "all\t\t\t\t%d\n", total+c.Consecutive)
	_ = w.Flush()
	return b.String()
}

func skipped(m map[string]int) string {
	n := 0
	var parts []string
	for _, reason := range skipReasons {
		if m[reason] > 0 {
			n += m[reason]
			parts = append(parts, fmt.Sprintf("%d %s", m[reason], reason))
		}
	}
	if n == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(parts, "; "))
}
