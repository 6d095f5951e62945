package apvet_test

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/atomicphase/atomicphase/apvet"
)

// TestCorpus measures apvet on its corpus and holds docs/apvet.md to the
// measurement. The sound workflows (testdata/src/corpus/sound: a
// money-transfer service on sqlc-style queries, pgx.Batch postings, clients
// built on call.Transport by a helper, a payout by reference to a bank
// without keys; and the repository's examples, tests included) must get no
// finding; every planted mistake (testdata/src/corpus/mistakes, one want
// comment each) must get its finding, and nothing else may be reported
// there. analysistest fails the test on any finding off the list and on
// any mistake missed; the counts below are what docs/apvet.md states.
func TestCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip("the analyzer over its whole measured corpus; make test-all runs it")
	}
	testdata := analysistest.TestData()
	sound := analysistest.Run(t, testdata, apvet.Analyzer, "corpus/sound/...")
	if _, err := os.Stat(filepath.Join("..", "examples", "go.mod")); err != nil {
		t.Fatalf("the examples are not beside apvet (%v): the corpus counts them", err)
	}
	// The examples are loaded within the workspace, not by analysistest
	// (corpus_examples_test.go says why); any finding there is unexpected.
	examples := analyzeExamples(t)
	mistakes := analysistest.Run(t, testdata, apvet.Analyzer, "corpus/mistakes/...")

	phases := map[string]bool{}
	falsePositives := map[string]bool{}
	for _, r := range sound {
		for _, p := range phaseFuncs(r.Pass.Fset, r.Pass.Files, r.Pass.TypesInfo) {
			phases[p] = true
		}
		for _, d := range r.Diagnostics {
			falsePositives[r.Pass.Fset.Position(d.Pos).String()+d.Message] = true
		}
	}
	for _, act := range examples {
		pkg := act.Package
		for _, p := range phaseFuncs(pkg.Fset, pkg.Syntax, pkg.TypesInfo) {
			phases[p] = true
		}
		for _, d := range act.Diagnostics {
			pos := pkg.Fset.Position(d.Pos).String()
			t.Errorf("%s: unexpected finding in the examples: %s", pos, d.Message)
			falsePositives[pos+d.Message] = true
		}
	}

	planted := map[string]bool{} // file:line of each want comment
	found := map[string]bool{}
	extra := map[string]bool{}
	wantRE := regexp.MustCompile(`// want `)
	for _, r := range mistakes {
		for _, f := range r.Pass.Files {
			for _, g := range f.Comments {
				for _, c := range g.List {
					if wantRE.MatchString(c.Text) {
						p := r.Pass.Fset.Position(c.Pos())
						planted[fmt.Sprintf("%s:%d", p.Filename, p.Line)] = true
					}
				}
			}
		}
	}
	for _, r := range mistakes {
		for _, d := range r.Diagnostics {
			p := r.Pass.Fset.Position(d.Pos)
			line := fmt.Sprintf("%s:%d", p.Filename, p.Line)
			if planted[line] {
				found[line] = true
			} else {
				extra[p.String()+d.Message] = true
			}
		}
	}
	fp := len(falsePositives) + len(extra)
	t.Logf("sound: %d phase functions, %d findings; mistakes: %d planted, %d found, %d findings besides",
		len(phases), len(falsePositives), len(planted), len(found), len(extra))
	t.Logf("precision %d/%d, recall %d/%d", len(found), len(found)+fp, len(found), len(planted))

	doc, err := os.ReadFile(filepath.Join("..", "docs", "apvet.md"))
	if err != nil {
		t.Fatalf("docs/apvet.md: %v", err)
	}
	m := regexp.MustCompile(`On its corpus, apvet reports nothing on (\d+) sound phase functions and (\d+) findings in all; it finds (\d+) of (\d+) planted mistakes`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/apvet.md states the corpus counts (\"On its corpus, apvet reports nothing on N sound phase functions and N findings in all; it finds N of N planted mistakes\")")
	}
	for i, want := range []int{len(phases), fp, len(found), len(planted)} {
		if got, _ := strconv.Atoi(string(m[i+1])); got != want {
			t.Errorf("docs/apvet.md says %q; the corpus measures %d where it says %d", m[0], want, got)
		}
	}
}

// phaseFuncs lists, as file:line:column, the functions apvet checks as
// phases in a package's files: those taking an atomicphase.Tx or a
// *atomicphase.ForeignCall.
func phaseFuncs(fset *token.FileSet, files []*ast.File, info *types.Info) []string {
	var out []string
	isPhaseParam := func(t types.Type) bool {
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		n, ok := types.Unalias(t).(*types.Named)
		return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "github.com/atomicphase/atomicphase" &&
			(n.Obj().Name() == "Tx" || n.Obj().Name() == "ForeignCall")
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			switch x := n.(type) {
			case *ast.FuncDecl:
				if x.Body != nil {
					ft = x.Type
				}
			case *ast.FuncLit:
				ft = x.Type
			}
			if ft == nil || ft.Params == nil {
				return true
			}
			for _, field := range ft.Params.List {
				if t := info.TypeOf(field.Type); t != nil && isPhaseParam(t) {
					p := fset.Position(n.Pos())
					out = append(out, strings.TrimPrefix(fmt.Sprintf("%s:%d:%d", p.Filename, p.Line, p.Column), "/"))
					break
				}
			}
			return true
		})
	}
	return out
}
