package atomicphase_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/mdanchor"
)

// docsURL is where the library's problem type URIs point: this
// repository's files, by path.
const docsURL = "https://github.com/atomicphase/atomicphase/blob/main/"

// Every problem type URI the library can answer with names a section that
// exists. The URIs are read from the source itself: every string constant
// and constant expression in the repository's non-test Go files
// (aphttp.ProblemTypeBase + "in-progress", atomicphase.ProblemInvalidData,
// …) that is a URL into its docs with a fragment; each fragment must be
// the anchor of a heading of the file it names, as the file's renderer
// makes anchors. A section renamed by hand, or a problem type added without
// its section, fails here.
func TestDocsLinkEveryProblemTypeToItsSection(t *testing.T) {
	t.Parallel()
	urls := docURLsInSource(t, ".")
	require.GreaterOrEqual(t, len(urls), 17, "the scan finds aphttp's problem types and atomicphase.ProblemInvalidData: %v", urls)
	for url, where := range urls {
		file, fragment, _ := strings.Cut(strings.TrimPrefix(url, docsURL), "#")
		text, err := os.ReadFile(filepath.FromSlash(file))
		require.NoError(t, err, "%s (%s) names a file of the repository", url, where)
		require.Contains(t, mdanchor.Anchors(string(text)), fragment, "%s (%s): %s has no section with the anchor #%s", url, where, file, fragment)
	}
}

// docURLsInSource evaluates the string constants and constant expressions
// of the non-test Go files under root (testdata and the examples aside)
// and returns those that are URLs into the docs with a fragment, each with
// where it is written.
func docURLsInSource(t *testing.T, root string) map[string]string {
	t.Helper()
	type file struct {
		dir     string
		ast     *ast.File
		imports map[string]string // local name → import path
	}
	fset := token.NewFileSet()
	var files []file
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (name == "testdata" || name == "examples" || name == "node_modules" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imports := map[string]string{}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			name := path.Base(ip)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = ip
		}
		files = append(files, file{filepath.ToSlash(filepath.Dir(p)), f, imports})
		return nil
	})
	require.NoError(t, err)

	// The package of an import path of this module is its directory.
	dirOf := func(importPath string) string {
		rel := strings.TrimPrefix(strings.TrimPrefix(importPath, "github.com/atomicphase/atomicphase"), "/")
		if rel == "" {
			return "."
		}
		return rel
	}
	consts := map[string]map[string]string{} // directory → constant → value
	var eval func(f file, e ast.Expr) (string, bool)
	eval = func(f file, e ast.Expr) (string, bool) {
		switch x := e.(type) {
		case *ast.BasicLit:
			if x.Kind == token.STRING {
				s, err := strconv.Unquote(x.Value)
				return s, err == nil
			}
		case *ast.ParenExpr:
			return eval(f, x.X)
		case *ast.Ident:
			v, ok := consts[f.dir][x.Name]
			return v, ok
		case *ast.SelectorExpr:
			if pkg, ok := x.X.(*ast.Ident); ok && f.imports[pkg.Name] != "" {
				v, ok := consts[dirOf(f.imports[pkg.Name])][x.Sel.Name]
				return v, ok
			}
		case *ast.BinaryExpr:
			if x.Op == token.ADD {
				a, okA := eval(f, x.X)
				b, okB := eval(f, x.Y)
				return a + b, okA && okB
			}
		}
		return "", false
	}
	// Constants may name constants declared later, or in another package:
	// evaluate until nothing new is found.
	for changed := true; changed; {
		changed = false
		for _, f := range files {
			for _, decl := range f.ast.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i >= len(vs.Values) {
							continue
						}
						if _, done := consts[f.dir][name.Name]; done {
							continue
						}
						if v, ok := eval(f, vs.Values[i]); ok {
							if consts[f.dir] == nil {
								consts[f.dir] = map[string]string{}
							}
							consts[f.dir][name.Name] = v
							changed = true
						}
					}
				}
			}
		}
	}
	fragment := regexp.MustCompile(`^` + regexp.QuoteMeta(docsURL) + `[^#]+#.+$`)
	urls := map[string]string{}
	for _, f := range files {
		ast.Inspect(f.ast, func(n ast.Node) bool {
			e, ok := n.(ast.Expr)
			if !ok {
				return true
			}
			if v, ok := eval(f, e); ok && fragment.MatchString(v) {
				urls[v] = fset.Position(e.Pos()).String()
			}
			return true
		})
	}
	return urls
}
