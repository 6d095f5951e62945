package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// unknownCap is where SweepResult.UnknownWorkflow stops counting.
const unknownCap = 1000

func (c *cli) sweepCmd() *cobra.Command {
	var (
		once      bool
		retention time.Duration
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "sweep --once",
		Short: "Sweep once: reap old finished keys, count keys left to resume",
		Long: strings.TrimSpace(`
Run one sweep, as a service's Sweeper does on every tick, with no workflow
registered: the CLI does not have your workflows' code, so this sweep
resumes no key. What it does:

  - reaps finished keys that finished more than --retention ago (a negative
    --retention skips this);
  - counts the abandoned and stale keys due to be resumed, all of them of
    workflows this CLI does not know (up to 1000): the sweep of a process that
    registered their workflows resumes them. List them with
    "atomicphase keys --status abandoned" and "--status stale".

--once is required: a sweep that keeps running belongs in the services,
which can resume keys (atomicphase.NewSweeper(runner, cfg).Run).`),
		Example: examples(
			`atomicphase sweep --once`,
			`atomicphase sweep --once --retention 72h --json`,
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !once {
				return usageErrorf("sweep runs once and exits: pass --once (keep a sweep running in the services that registered the workflows; the CLI cannot resume keys)")
			}
			if retention == 0 {
				return usageErrorf("--retention 0 would mean the library's default (%s); give a positive duration, a negative one to skip reaping, or use `atomicphase reap --older-than 0`", atomicphase.DefaultKeyRetention)
			}
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				s, err := atomicphase.NewSweeper(r, &atomicphase.SweepConfig{Retention: retention})
				if err != nil {
					return err
				}
				res, err := s.RunOnce(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSONLine(c.stdout, sweepJSON{
						Reaped: res.Reaped, UnknownWorkflow: res.UnknownWorkflow,
						UnknownWorkflowCapped: res.UnknownWorkflow >= unknownCap, Resumed: res.Examined,
					})
				}
				c.writeSweep(res, retention)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&once, "once", false, "sweep once and exit (required)")
	f.DurationVar(&retention, "retention", atomicphase.DefaultKeyRetention, "reap finished keys that finished longer ago than this; negative: do not reap")
	f.BoolVar(&asJSON, "json", false, "print the counts as one JSON object")
	return cmd
}

// sweepJSON is what `sweep --once --json` prints.
type sweepJSON struct {
	// Resumed is always 0: the CLI registers no workflow.
	Resumed               int  `json:"resumed"`
	Reaped                int  `json:"reaped"`
	UnknownWorkflow       int  `json:"unknown_workflow"`
	UnknownWorkflowCapped bool `json:"unknown_workflow_capped"`
}

func (c *cli) writeSweep(res atomicphase.SweepResult, retention time.Duration) {
	w := c.stdout
	fmt.Fprintln(w, "swept once with no workflow registered: no key was resumed (the CLI cannot run phases)")
	if retention < 0 {
		fmt.Fprintln(w, "reaped: none (reaping skipped: --retention is negative)")
	} else {
		fmt.Fprintf(w, "reaped: %d finished keys that finished more than %s ago\n", res.Reaped, retention)
	}
	n := fmt.Sprint(res.UnknownWorkflow)
	if res.UnknownWorkflow >= unknownCap {
		n = fmt.Sprintf("%d or more", unknownCap)
	}
	fmt.Fprintf(w, "due to be resumed: %s abandoned or stale keys of workflows the CLI does not know", n)
	if res.UnknownWorkflow > 0 {
		fmt.Fprint(w, "; the next sweep of a process that registered their workflow resumes them (list them: atomicphase keys --status abandoned, and --status stale)")
	}
	fmt.Fprintln(w)
}
