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
}

// Fault is an action at a point.
type Fault struct {
	// Point is where the fault was injected.
	Point atomicphase.FaultPoint
	// Action is what was done there.
	Action faultinject.Action
}

// String renders the fault as "workflow:phase:place action".
func (f Fault) String() string { return f.Point.String() + " " + string(f.Action) }

// Report is the result of an exploration.
type Report struct {
	// Scenario is the scenario's name (and, for a random exploration, its
	// seed).
	Scenario string
	// Points are the fault points the clean run passed, in order.
	Points []faultinject.Passed
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
				ps, as = append(ps, f.Point.String()), append(as, string(f.Action))
			}
			points, actions = strings.Join(ps, " → "), strings.Join(as, " → ")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", points, actions, row.Attempts, row.Outcome, verdict)
	}
	_ = w.Flush()
	return b.String()
}
