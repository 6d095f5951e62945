package atomicphasetest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
)

func TestReportTableAndViolation(t *testing.T) {
	t.Parallel()
	commit := atomicphase.FaultPoint{Workflow: "shop", Phase: "charge", Place: atomicphase.BeforeCommit}
	acquire := atomicphase.FaultPoint{Workflow: "shop", Place: atomicphase.AfterAcquire}
	rep := &atomicphasetest.Report{
		Scenario: "shop",
		Points:   []faultinject.Passed{{Point: acquire}, {Point: commit, HasConn: true}},
		Rows: []atomicphasetest.Row{
			{Attempts: 1, Outcome: "201"},
			{Faults: []atomicphasetest.Fault{{Point: commit, Action: faultinject.Crash}}, Attempts: 2, Outcome: "201"},
			{Faults: []atomicphasetest.Fault{{Point: acquire, Action: faultinject.Error}, {Point: commit, Action: faultinject.Panic}},
				Attempts: 3, Outcome: "201", Violation: errors.New("2 distinct charges")},
		},
	}
	require.Same(t, &rep.Rows[2], rep.Violation())
	require.Equal(t, "shop:charge:before-commit crash", rep.Rows[1].Faults[0].String())

	lines := strings.Split(strings.TrimSpace(rep.String()), "\n")
	require.Equal(t, `fault exploration "shop": 2 points, 3 runs`, lines[0])
	require.Equal(t, []string{"POINT", "ACTION", "ATTEMPTS", "OUTCOME", "INVARIANT"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"(none)", "-", "1", "201", "ok"}, strings.Fields(lines[2]))
	require.Equal(t, []string{"shop:charge:before-commit", "crash", "2", "201", "ok"}, strings.Fields(lines[3]))
	require.Equal(t, "shop:after-acquire → shop:charge:before-commit  error → panic  3  201  VIOLATED: 2 distinct charges",
		collapse(lines[4]))

	rep.Rows = rep.Rows[:2]
	require.Nil(t, rep.Violation())
}

// collapse squeezes the table's column padding to two spaces.
func collapse(s string) string {
	for strings.Contains(s, "   ") {
		s = strings.ReplaceAll(s, "   ", "  ")
	}
	return s
}
