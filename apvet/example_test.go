package apvet_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/atomicphase/atomicphase/apvet"
)

// Example runs apvet from a program, as a tool that embeds it would, over
// a workflow whose phase writes through the pool instead of its tx (the
// package testdata/src/example, loaded from a GOPATH tree). Most users run
// it as go vet's tool instead: go vet -vettool=$(go env GOPATH)/bin/apvet ./...
func Example() {
	gopath, err := filepath.Abs("testdata")
	if err != nil {
		log.Fatal(err)
	}
	pkgs, err := packages.Load(&packages.Config{
		Mode: packages.LoadSyntax,
		Dir:  gopath,
		Env:  append(os.Environ(), "GOPATH="+gopath, "GO111MODULE=off", "GOWORK=off", "GOFLAGS="),
	}, "example")
	if err != nil {
		log.Fatal(err)
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{apvet.Analyzer}, pkgs, nil)
	if err != nil {
		log.Fatal(err)
	}
	for act := range graph.All() {
		for _, d := range act.Diagnostics {
			pos := act.Package.Fset.Position(d.Pos)
			finding, why, _ := strings.Cut(d.Message, ": ")
			fmt.Printf("%s:%d: [%s] %s\n  %.70s…\n", filepath.Base(pos.Filename), pos.Line, d.Category, finding, why)
		}
	}
	// Output:
	// example.go:16: [handle] pool (a *pgxpool.Pool) is used in a phase instead of its transaction tx
	//   what it writes there commits on its own, outside the phase's transacti…
}
