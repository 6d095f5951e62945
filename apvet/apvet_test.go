package apvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/atomicphase/atomicphase/apvet"
)

// TestBrokenWorkflowsAreFlagged: every mistake in testdata/src/broken is
// reported, with its reason (the want comments), and nothing else.
func TestBrokenWorkflowsAreFlagged(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), apvet.Analyzer, "broken")
}

// TestSoundWorkflowIsClean: a sound workflow — its pool used outside the
// phases, tx.Conn() and savepoints used inside, one call.Do per path, a
// reconcile lookup, call.Transport — gets no report.
func TestSoundWorkflowIsClean(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), apvet.Analyzer, "good")
}

// TestSuppressions: //apvet:ignore RULE REASON hides one finding of RULE,
// on its line or the next; a suppression that hides nothing, names an
// unknown rule or gives no reason is a finding itself.
func TestSuppressions(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), apvet.Analyzer, "suppressed")
}
