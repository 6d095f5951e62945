package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The README says what the code does: its status table lists every key
// status, its command list every command, and its migrate example every
// migration.
func TestREADMEFollowsTheCode(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(raw)

	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)` \\|").FindAllStringSubmatch(readme, -1) {
		listed = append(listed, m[1])
	}
	var statuses []string
	for _, s := range atomicphase.KeyStatuses() {
		statuses = append(statuses, string(s))
	}
	require.Equal(t, statuses, listed, "the status table lists every key status, in order")

	var commands []string
	for _, m := range regexp.MustCompile(`(?m)^atomicphase (\w+)`).FindAllStringSubmatch(readme, -1) {
		if !strings.Contains(strings.Join(commands, " "), m[1]) {
			commands = append(commands, m[1])
		}
	}
	var want []string
	for _, cmd := range (&cli{}).rootCmd().Commands() {
		if cmd.IsAvailableCommand() && cmd.Name() != "help" && cmd.Name() != "completion" {
			want = append(want, cmd.Name())
		}
	}
	require.ElementsMatch(t, want, commands, "the command list names every command")

	migrations, err := atomicphase.Migrations(nil)
	require.NoError(t, err)
	var applied []string
	for _, m := range migrations {
		applied = append(applied, fmt.Sprintf("applied %03d_%s", m.Version, m.Name))
	}
	latest := fmt.Sprintf("%03d", migrations[len(migrations)-1].Version)
	require.Contains(t, readme, strings.Join(applied, "\n")+"\nschema at version "+latest+"\n",
		"the migrate example applies every migration")
	require.Contains(t, readme, "up to date (version "+latest+")")
}
