package apvet_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/atomicphase/atomicphase/apvet"
)

// TestBrokenWorkflowsAreFlagged: every mistake in testdata/src/broken is
// reported, with its reason (the want comments), and nothing else.
// docs/apvet.md quotes some of these findings: each quoted line must be
// one of them, word for word.
func TestBrokenWorkflowsAreFlagged(t *testing.T) {
	results := analysistest.Run(t, analysistest.TestData(), apvet.Analyzer, "broken")
	found := map[string]bool{}
	for _, r := range results {
		for _, d := range r.Diagnostics {
			p := r.Pass.Fset.Position(d.Pos)
			found[fmt.Sprintf("%s:%d:%d: %s", filepath.Base(p.Filename), p.Line, p.Column, d.Message)] = true
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "apvet.md"))
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile("(?m)^[a-z]+\\.go:\\d+:\\d+: .*$").FindAllString(string(doc), -1)
	if len(quoted) == 0 {
		t.Fatal("docs/apvet.md quotes no finding")
	}
	for _, q := range quoted {
		if !found[q] {
			t.Errorf("docs/apvet.md quotes a finding apvet does not report on testdata/src/broken:\n%s", q)
		}
	}
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
