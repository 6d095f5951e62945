package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// lastErrorWidth is how much of a key's last error the table shows; inspect
// shows all of it.
const lastErrorWidth = 40

func (c *cli) keysCmd() *cobra.Command {
	var (
		status    string
		filter    atomicphase.KeyFilter
		olderThan time.Duration
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "List idempotency keys, oldest first",
		Long: strings.TrimSpace(`
List idempotency keys, oldest first, as a table or, with --json, as one JSON
object a line. The filters combine; without any, the oldest 100 keys of any
status are listed.

A key's status is one of:
  in_progress  an attempt holds its lock
  stale        its lease (stored on the key) ended: the holder died or is slow
  abandoned    unfinished and unlocked: the sweep (or a client retry) resumes it
  unknown      a call to a downstream without idempotency keys may or may not
               have taken effect: the sweep (or a retry) reconciles it
  parked       failed permanently or too often: left for an operator
  finished     its response is stored and replayed

The table cuts the last error to ` + strconv.Itoa(lastErrorWidth) + ` characters; inspect shows all of it.`),
		Example: examples(
			`atomicphase keys --status parked`,
			`atomicphase keys --workflow create_ride --older-than 1h --limit 20`,
			`atomicphase keys --status abandoned --json | jq -r .key`,
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter.Status = atomicphase.KeyStatus(status)
			if status != "" && !slices.Contains(atomicphase.KeyStatuses(), filter.Status) {
				return usageErrorf("--status %q is not a key status; use one of %s", status, statusList())
			}
			if olderThan < 0 {
				return usageErrorf("--older-than %s is negative; give an age such as 1h", olderThan)
			}
			if filter.Limit <= 0 {
				return usageErrorf("--limit %d: give a positive number of keys", filter.Limit)
			}
			filter.OlderThan = olderThan
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				keys, err := r.ListKeys(cmd.Context(), &filter)
				if err != nil {
					return err
				}
				if asJSON {
					for _, k := range keys {
						if err := writeJSONLine(c.stdout, summarize(k)); err != nil {
							return err
						}
					}
				} else if err := c.writeKeyTable(keys); err != nil {
					return err
				}
				if len(keys) == filter.Limit {
					fmt.Fprintf(c.stderr, "showing the oldest %d matching keys; raise --limit to see more\n", filter.Limit)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&status, "status", "", "only keys with this status: "+statusList())
	f.StringVar(&filter.Workflow, "workflow", "", "only keys of this workflow")
	f.StringVar(&filter.Scope, "scope", "", "only keys of this scope")
	f.DurationVar(&olderThan, "older-than", 0, "only keys created longer ago than this, such as 1h or 30m")
	f.IntVar(&filter.Limit, "limit", atomicphase.DefaultListLimit, "the most keys listed")
	f.BoolVar(&asJSON, "json", false, "print one JSON object a line instead of a table")
	return cmd
}

func (c *cli) writeKeyTable(keys []*atomicphase.KeyInfo) error {
	if len(keys) == 0 {
		_, err := fmt.Fprintln(c.stdout, "no keys match")
		return err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tWORKFLOW\tSTATUS\tRECOVERY POINT\tATTEMPTS\tLAST ERROR\tCREATED\tUPDATED\tPARKED")
	for _, k := range keys {
		lastErr := "-"
		if k.LastError != nil {
			lastErr = cell(truncate(oneLine(*k.LastError), lastErrorWidth))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
			cell(k.Scope), cell(k.Key), cell(k.Workflow), k.Status, cell(k.RecoveryPoint), k.Attempts,
			lastErr, timeCell(k.CreatedAt), timeCell(k.UpdatedAt), timePtrCell(k.ParkedAt))
	}
	return tw.Flush()
}

func statusList() string {
	statuses := atomicphase.KeyStatuses()
	names := make([]string, len(statuses))
	for i, s := range statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
