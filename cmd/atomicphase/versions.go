package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// versionSummary is a workflow version as `versions --json` prints it, one
// JSON object a line.
type versionSummary struct {
	Workflow     string     `json:"workflow"`
	Version      string     `json:"version"`
	Phases       []string   `json:"phases"`
	Deployed     bool       `json:"deployed"`
	RegisteredAt *time.Time `json:"registered_at"`
	SeenAt       *time.Time `json:"seen_at"`
	Unfinished   int        `json:"unfinished"`
	Parked       int        `json:"parked"`
	Unknown      int        `json:"unknown"`
	Oldest       *time.Time `json:"oldest"`
	Drained      bool       `json:"drained"`
}

func (c *cli) versionsCmd() *cobra.Command {
	var (
		asJSON  bool
		horizon time.Duration
	)
	cmd := &cobra.Command{
		Use:   "versions",
		Short: "List workflow versions: who runs each, and whether its keys are drained",
		Long: strings.TrimSpace(`
List, per workflow and version, whether a process runs it (recorded by its
sweep within --horizon), and its unfinished keys: how many, how many of
them parked or waiting on an unknown outcome, and the oldest's age. A
version is drained when it has no unfinished key: its definition can then
be deleted from the code, once no process runs it.

Every key records the version of the workflow definition it started under
and resumes under that definition. A version "" stands for keys recorded
by a release older than versions. A key whose version no process runs is
parked by the sweep, with the version named: deploy a build that registers
it, then unpark the key.`),
		Example: examples(
			`atomicphase versions`,
			`atomicphase versions --json | jq 'select(.drained | not)'`,
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if horizon <= 0 {
				return usageErrorf("--horizon %s: give a positive duration, such as 24h", horizon)
			}
			return c.withRunnerConfig(cmd.Context(), &atomicphase.Config{VersionHorizon: horizon}, func(r *atomicphase.Runner) error {
				vs, err := r.Versions(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(c.stdout)
					for _, v := range vs {
						if err := enc.Encode(versionSummary{Workflow: v.Workflow, Version: v.Version, Phases: v.Phases,
							Deployed: v.Deployed, RegisteredAt: v.RegisteredAt, SeenAt: v.SeenAt, Unfinished: v.Unfinished,
							Parked: v.Parked, Unknown: v.Unknown, Oldest: v.Oldest, Drained: v.Drained()}); err != nil {
							return err
						}
					}
					return nil
				}
				w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(w, "WORKFLOW\tVERSION\tDEPLOYED\tLAST SEEN\tUNFINISHED\tPARKED\tUNKNOWN\tOLDEST\tPHASES")
				for _, v := range vs {
					version := v.Version
					if version == "" {
						version = "(none)"
					}
					deployed := "no"
					if v.Deployed {
						deployed = "yes"
					}
					oldest := "drained"
					if v.Oldest != nil {
						oldest = age(time.Since(*v.Oldest)) + " old"
					}
					seen := "-"
					if v.SeenAt != nil {
						seen = age(time.Since(*v.SeenAt)) + " ago"
					}
					phases := strings.Join(v.Phases, ",")
					if phases == "" {
						phases = "-"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", cell(v.Workflow), cell(version), deployed, seen,
						v.Unfinished, v.Parked, v.Unknown, oldest, cell(phases))
				}
				return w.Flush()
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "one JSON object a line")
	f.DurationVar(&horizon, "horizon", atomicphase.DefaultVersionHorizon, "a version counts as deployed when a process recorded it within this long")
	return cmd
}

// age renders a duration to the second, or to the minute past an hour.
func age(d time.Duration) string {
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}
