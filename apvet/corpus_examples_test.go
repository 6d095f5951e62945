package apvet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/atomicphase/atomicphase/apvet"
)

// The corpus counts the repository's examples as sound code, and they must
// be loaded the way the repository builds them: as part of the workspace
// (go.work at the root), whose build list is the one `make test`,
// `make vet/workflows` and `go vet -vettool=apvet ./examples/...` use.
//
// analysistest.Run cannot do that. Given a directory with a go.mod, it runs
// the go command with GOWORK=off and GOPROXY=off, so it loads the examples
// under their own go.mod's build list instead of the workspace's: there
// golang.org/x/sys is v0.34.0 (the workspace selects a later one, which
// another of its modules requires), and with the proxy off that version
// has to be in the module cache already. Nothing built in the workspace
// needs its source, so on a machine whose cache was filled by building the
// workspace (a fresh machine running `make test`) it is not there. go list
// then reports golang.org/x/sys/unix as missing ("module lookup disabled
// by GOPROXY=off", positioned at logrus's import of it); go/packages takes
// the file at that position (logrus's terminal_check_unix.go) for the
// missing package's source and type-checks it as golang.org/x/sys/unix: a
// package named logrus, without unix's names. Hence "undefined: unix" in
// every package importing it (logrus, moby/term, moby/sys/user,
// dockertest) and `"golang.org/x/sys/unix" imported as logrus and not
// used` at each import. Whether the corpus passed depended on whether
// something had earlier run a go command in examples/ outside the
// workspace (`go mod tidy`, as `make lint` does) and so downloaded
// v0.34.0: it followed the module cache's content, not the builds running
// beside it, and no build cache entry was mixed up.
//
// loadExamples therefore loads them with packages.Load itself, GOWORK set
// to the repository's go.work and the rest of the environment as the go
// command gets it (its proxy included: a module the workspace needs and
// the cache lacks is fetched as `go test ./examples/...` would fetch it),
// and analyzeExamples runs apvet with the checker analysistest uses.
// TestCorpusLoadsExamplesAsTheWorkspaceBuildsThem holds every loaded
// dependency to the workspace's version.

var examples struct {
	once sync.Once
	root string // the repository's root
	pkgs []*packages.Package
	err  error
}

// loadExamples loads the examples' packages, tests included, with their
// syntax and types, as the workspace builds them; it fails t on any error
// in loading or in any package.
func loadExamples(t *testing.T) (root string, pkgs []*packages.Package) {
	t.Helper()
	examples.once.Do(func() {
		examples.root, examples.err = filepath.Abs("..")
		if examples.err != nil {
			return
		}
		examples.pkgs, examples.err = packages.Load(&packages.Config{
			// What analysistest.Run asks for.
			Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles | packages.NeedImports |
				packages.NeedTypes | packages.NeedTypesSizes | packages.NeedSyntax | packages.NeedTypesInfo |
				packages.NeedDeps | packages.NeedModule,
			Dir:   filepath.Join(examples.root, "examples"),
			Tests: true,
			Env:   append(os.Environ(), workspaceEnv(examples.root)...),
		}, "./...")
	})
	require.NoError(t, examples.err, "loading the examples")
	require.NotEmpty(t, examples.pkgs, "the examples have packages")
	var errs []string
	packages.Visit(examples.pkgs, nil, func(p *packages.Package) {
		for _, err := range p.Errors {
			errs = append(errs, err.Error())
		}
	})
	require.Empty(t, errs, "the examples load without errors as the workspace builds them")
	return examples.root, examples.pkgs
}

// workspaceEnv is what the go command needs, besides the environment it
// inherits, to build within the repository's workspace from any of its
// directories (a GOWORK=off or GO111MODULE=off inherited would not).
func workspaceEnv(root string) []string {
	return []string{"GO111MODULE=on", "GOWORK=" + filepath.Join(root, "go.work")}
}

// analyzeExamples runs apvet over the examples and returns the root
// actions (a package, its test variant and its external tests each have
// one). An analysis that fails fails t.
func analyzeExamples(t *testing.T) []*checker.Action {
	t.Helper()
	_, pkgs := loadExamples(t)
	graph, err := checker.Analyze([]*analysis.Analyzer{apvet.Analyzer}, pkgs, &checker.Options{SanityCheck: true})
	require.NoError(t, err)
	for _, act := range graph.Roots {
		require.NoError(t, act.Err, "analyzing %s", act.Package.PkgPath)
	}
	return graph.Roots
}

// TestCorpusLoadsExamplesAsTheWorkspaceBuildsThem holds the corpus's load
// of the examples to the workspace's build list: every module a loaded
// package comes from is at the version `go list -m all` gives at the
// repository's root. Loaded under the examples' own go.mod, as
// analysistest.Run loads a module, golang.org/x/sys is at another version
// (and the load fails where the module cache lacks it).
func TestCorpusLoadsExamplesAsTheWorkspaceBuildsThem(t *testing.T) {
	if testing.Short() {
		t.Skip("the analyzer over its whole measured corpus; make test-all runs it")
	}
	root, pkgs := loadExamples(t)

	list := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	list.Dir = root
	list.Env = append(os.Environ(), workspaceEnv(root)...)
	out, err := list.Output()
	require.NoError(t, err, "go list -m all in the workspace")
	workspace := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, version, _ := strings.Cut(line, " ")
		workspace[path] = version
	}

	loaded := map[string]string{}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		if p.Module != nil {
			loaded[p.Module.Path] = p.Module.Version
		}
	})
	require.Contains(t, loaded, "golang.org/x/sys", "the examples depend on golang.org/x/sys (through logrus and moby/term)")
	for path, version := range loaded {
		want, ok := workspace[path]
		require.True(t, ok, "%s (loaded at %q) is in the workspace's build list", path, version)
		require.Equal(t, want, version, "%s is loaded at the workspace's version", path)
	}
}
