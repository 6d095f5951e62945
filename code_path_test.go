package atomicphase_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A request's path reads downward: following Runner.Run through the code,
// every function it can reach calls only functions in its own file, in a
// file further down docs/concepts.md's list of the path ("The code, file by
// file"), or in a utility that stands aside; a utility calls no file of the
// path. The list is read from the docs, so the docs and the code cannot
// drift apart, and every file the path reaches must be placed in it.
//
// Calls are followed through uses of the package's functions and methods
// (calls, method values and expressions, in closures and goroutines too)
// and through its own interfaces, not through function values kept in
// variables or struct fields: the closures a workflow's definition builds
// for the path (startStep's, makeStep's) and what a phase calls back (its
// transaction, a savepoint, its foreign call) are followed as roots of
// their own instead.
func TestRequestPathReadsDownward(t *testing.T) {
	t.Parallel()
	path, aside := codePathOfDocs(t)
	rank := map[string]int{}
	for i, f := range path {
		rank[f] = i
	}
	edges := callsFrom(t, ".", func(fn string) bool {
		// Run, and what a phase calls back: its transaction, a savepoint
		// of it, its foreign call.
		recv, method, _ := strings.Cut(fn, ".")
		switch recv {
		case "*phaseTx", "*savepoint", "*ForeignCall":
			return token.IsExported(method)
		}
		return fn == "*Runner.Run" || fn == "startStep" || fn == "makeStep"
	})
	reached := map[string]bool{}
	var problems []string
	for _, e := range edges {
		reached[e.fromFile], reached[e.toFile] = true, true
		if e.fromFile == e.toFile {
			continue
		}
		from, fromPath := rank[e.fromFile]
		to, toPath := rank[e.toFile]
		switch {
		case fromPath && toPath && to < from:
			problems = append(problems, fmt.Sprintf("%s climbs back up to %s: %s calls %s", e.fromFile, e.toFile, e.from, e.to))
		case !fromPath && toPath:
			problems = append(problems, fmt.Sprintf("%s, which stands aside, calls into the path: %s calls %s (%s)", e.fromFile, e.from, e.to, e.toFile))
		}
	}
	for f := range reached {
		if _, ok := rank[f]; !ok && !aside[f] {
			problems = append(problems, fmt.Sprintf("%s is on the request's path but docs/concepts.md neither lists it as a step nor as standing aside", f))
		}
	}
	for _, f := range append(path, slices.Sorted(maps.Keys(aside))...) {
		if !reached[f] {
			problems = append(problems, fmt.Sprintf("docs/concepts.md places %s on the request's path or beside it, but Run never reaches it", f))
		}
	}
	slices.Sort(problems)
	require.Empty(t, slices.Compact(problems))
}

// codePathOfDocs reads the request's path (the numbered list's files, in
// order) and the files standing aside from docs/concepts.md's "The code,
// file by file".
func codePathOfDocs(t *testing.T) (path []string, aside map[string]bool) {
	t.Helper()
	doc, err := os.ReadFile("docs/concepts.md")
	require.NoError(t, err)
	doc = bytes.ReplaceAll(doc, []byte("\r\n"), []byte("\n"))
	_, section, ok := bytes.Cut(doc, []byte("\n## The code, file by file\n"))
	require.True(t, ok, "docs/concepts.md has no section The code, file by file")
	section, _, _ = bytes.Cut(section, []byte("\n## "))
	goFile := regexp.MustCompile("`([a-z0-9_]+\\.go)`")
	step := regexp.MustCompile(`^\d+\. (.*?) — `)
	aside = map[string]bool{}
	inAside := false
	sc := bufio.NewScanner(bytes.NewReader(section))
	for sc.Scan() {
		line := sc.Text()
		if m := step.FindStringSubmatch(line); m != nil {
			for _, f := range goFile.FindAllStringSubmatch(m[1], -1) {
				path = append(path, f[1])
			}
		}
		if strings.HasPrefix(line, "Standing aside") {
			inAside = true
		}
		if strings.TrimSpace(line) == "" {
			inAside = false
		}
		if inAside {
			for _, f := range goFile.FindAllStringSubmatch(line, -1) {
				aside[f[1]] = true
			}
		}
	}
	require.NotEmpty(t, path, "docs/concepts.md lists no step of the path")
	require.NotEmpty(t, aside, "docs/concepts.md names nothing standing aside")
	seen := map[string]bool{}
	for _, f := range path {
		require.False(t, seen[f], "docs/concepts.md lists %s twice on the path", f)
		require.False(t, aside[f], "docs/concepts.md lists %s both on the path and standing aside", f)
		seen[f] = true
	}
	return path, aside
}

// A callEdge is one function of the package using another (a call or a
// method value), with the files they are declared in.
type callEdge struct{ from, to, fromFile, toFile string }

// callsFrom type-checks the package in dir (test files left out) and
// returns every use of one of its functions by a function reachable from
// one that root accepts (by its name: "Name", or "*Type.Name" for a
// method). A call through one of the package's interfaces reaches every
// method of that name and signature on a type of the package that has all
// of the interface's methods.
func callsFrom(t *testing.T, dir string, root func(name string) bool) []callEdge {
	t.Helper()
	// Dependencies come from the build's export data, which go list
	// builds; the package's files are the ones its build takes (go list
	// prints the package itself last).
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export,Dir,GoFiles", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list -export: %s", stderr.String())
	exports := map[string]string{}
	var self struct {
		ImportPath, Export, Dir string
		GoFiles                 []string
	}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		if err := dec.Decode(&self); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		exports[self.ImportPath] = self.Export
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})}
	pkg, err := conf.Check(self.ImportPath, fset, files, info)
	require.NoError(t, err)

	decls := map[types.Object]*ast.FuncDecl{}
	nameOf := map[*ast.FuncDecl]string{}
	methods := map[string][]*ast.FuncDecl{}    // by method name
	methodSets := map[string]map[string]bool{} // by receiver's type name
	receiverType := func(fd *ast.FuncDecl) string {
		typ := strings.TrimPrefix(types.ExprString(fd.Recv.List[0].Type), "*")
		typ, _, _ = strings.Cut(typ, "[")
		return typ
	}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			decls[info.Defs[fd.Name]] = fd
			nameOf[fd] = fd.Name.Name
			if fd.Recv != nil {
				nameOf[fd] = types.ExprString(fd.Recv.List[0].Type) + "." + fd.Name.Name
				typ := receiverType(fd)
				methods[fd.Name.Name] = append(methods[fd.Name.Name], fd)
				if methodSets[typ] == nil {
					methodSets[typ] = map[string]bool{}
				}
				methodSets[typ][fd.Name.Name] = true
			}
		}
	}
	callees := func(obj types.Object) []*ast.FuncDecl {
		fn, ok := obj.(*types.Func)
		if !ok {
			return nil
		}
		fn = fn.Origin()
		if fd, ok := decls[fn]; ok {
			return []*ast.FuncDecl{fd}
		}
		sig := fn.Type().(*types.Signature)
		if sig.Recv() == nil || fn.Pkg() != pkg {
			return nil
		}
		iface, ok := sig.Recv().Type().Underlying().(*types.Interface)
		if !ok {
			return nil
		}
		var impls []*ast.FuncDecl
		for _, fd := range methods[fn.Name()] {
			set := methodSets[receiverType(fd)]
			all := sameParams(info.Defs[fd.Name].Type().(*types.Signature), sig)
			for m := range iface.Methods() {
				all = all && set[m.Name()]
			}
			if all {
				impls = append(impls, fd)
			}
		}
		return impls
	}

	fileOf := func(n ast.Node) string { return filepath.Base(fset.Position(n.Pos()).Filename) }
	seen := map[*ast.FuncDecl]bool{}
	var queue []*ast.FuncDecl
	for fd, name := range nameOf {
		if root(name) {
			seen[fd] = true
			queue = append(queue, fd)
		}
	}
	require.NotEmpty(t, queue, "no function of the package is a root")
	var edges []callEdge
	for len(queue) > 0 {
		fd := queue[0]
		queue = queue[1:]
		if fd.Body == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			for _, callee := range callees(info.Uses[id]) {
				edges = append(edges, callEdge{nameOf[fd], nameOf[callee], fileOf(fd), fileOf(callee)})
				if !seen[callee] {
					seen[callee] = true
					queue = append(queue, callee)
				}
			}
			return true
		})
	}
	return edges
}

// sameParams reports whether two methods' parameters and results are
// identical, their receivers aside.
func sameParams(a, b *types.Signature) bool {
	strip := func(s *types.Signature) *types.Signature {
		return types.NewSignatureType(nil, nil, nil, s.Params(), s.Results(), s.Variadic())
	}
	return types.Identical(strip(a), strip(b))
}
