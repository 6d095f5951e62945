package keystore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeyTableSQLLivesHere keeps this package the key table's one home: no
// string in the library's other production code (the root package, the
// CLI, the test support, the adapters) names the table or calls one of its
// functions. The examples and the benchmark's designs are users' code, and
// read the table as users may; so do the benchmarks.
func TestKeyTableSQLLivesHere(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	skip := map[string]bool{"examples": true, filepath.Join("cmd", "bench-compare"): true, filepath.Join("cmd", "bench-scale"): true, filepath.Join("internal", "keystore"): true}
	fset := token.NewFileSet()
	var found []string
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (skip[rel] || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && (strings.Contains(s, "idempotency_keys") || functionCall.MatchString(s)) {
				found = append(found, fset.Position(lit.Pos()).String())
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 50, "the walk reads the library's files")
	require.Empty(t, found, "SQL on the key table belongs in internal/keystore")
}
