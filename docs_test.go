package atomicphase_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The metrics tables say what the code reports: docs/operations.md has a
// row, and the OpenTelemetry adapter's package doc an entry, for every
// event kind, and for nothing else.
func TestMetricsTablesFollowTheCode(t *testing.T) {
	t.Parallel()
	var kinds []string
	for _, k := range atomicphase.EventKinds() {
		kinds = append(kinds, string(k))
	}

	ops, err := os.ReadFile(filepath.Join("docs", "operations.md"))
	require.NoError(t, err)
	metrics := regexp.MustCompile(`(?s)## Metrics\n(.*?)\n## `).FindSubmatch(ops)
	require.NotNil(t, metrics, "docs/operations.md has a Metrics section")
	var rows []string
	for _, row := range regexp.MustCompile("(?m)^\\| (`[^|]*`) \\|").FindAllSubmatch(metrics[1], -1) {
		for _, name := range regexp.MustCompile("`([a-z_.]+)`").FindAllSubmatch(row[1], -1) {
			rows = append(rows, string(name[1]))
		}
	}
	require.ElementsMatch(t, kinds, rows, "docs/operations.md's metrics table lists every event kind")

	doc, err := os.ReadFile(filepath.Join("apotel", "doc.go"))
	require.NoError(t, err)
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^//   - atomicphase\.([a-z_.]+) \(`).FindAllSubmatch(doc, -1) {
		if string(m[1]) != "phase.duration" { // the histogram, not an event
			listed = append(listed, string(m[1]))
		}
	}
	require.ElementsMatch(t, kinds, listed, "apotel's package doc lists every event kind")
}

// Every test the threat model in docs/security-and-limits.md names exists:
// the table cannot go on citing a test that was renamed or removed.
func TestThreatModelNamesRealTests(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "security-and-limits.md"))
	require.NoError(t, err)
	section := regexp.MustCompile(`(?s)## Threat model\n(.*?)\n## `).FindSubmatch(doc)
	require.NotNil(t, section, "docs/security-and-limits.md has a threat model")
	var sources strings.Builder
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		sources.Write(b)
		return err
	})
	require.NoError(t, err)
	names := regexp.MustCompile("`(?:[a-z]+\\.)?(Test\\w+)`").FindAllSubmatch(section[1], -1)
	require.Greater(t, len(names), 15)
	for _, n := range names {
		require.Contains(t, sources.String(), "func "+string(n[1])+"(", "the threat model names %s", n[1])
	}
}
