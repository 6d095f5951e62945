package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) reapCmd() *cobra.Command {
	var (
		olderThan         time.Duration
		batch, maxBatches int
	)
	cmd := &cobra.Command{
		Use:   "reap --older-than DURATION",
		Short: "Delete finished keys that finished long enough ago",
		Long: strings.TrimSpace(`
Delete finished keys that finished longer ago than --older-than, and print
how many. Their stored responses are no longer replayed: a client retrying
with one of those keys afterwards runs a new request. Keep --older-than at
least as long as clients retry. Unfinished and parked keys are never
deleted.

The sweep of every service reaps on its own (SweepConfig.Retention); reap is
for a cron job, or after a retention change. It deletes in statements of
--batch-size keys, at most --max-batches of them; run it again if it says it
stopped at that cap.`),
		Example: examples(
			`atomicphase reap --older-than 24h`,
			`atomicphase reap --older-than 168h --batch-size 5000 --max-batches 1000`,
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than") {
				return usageErrorf("reap needs --older-than DURATION, such as --older-than 24h: keys that finished longer ago than that are deleted")
			}
			switch {
			case olderThan < 0:
				return usageErrorf("--older-than %s is negative; give an age such as 24h (0 deletes every finished key)", olderThan)
			case batch <= 0:
				return usageErrorf("--batch-size %d: give a positive number of keys", batch)
			case maxBatches <= 0:
				return usageErrorf("--max-batches %d: give a positive number", maxBatches)
			}
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				n, err := r.Reap(cmd.Context(), olderThan, batch, maxBatches)
				fmt.Fprintf(c.stdout, "deleted %d finished keys that finished more than %s ago\n", n, olderThan)
				if err == nil && n == batch*maxBatches {
					fmt.Fprintf(c.stdout, "stopped at the cap of %d keys (--batch-size × --max-batches); run reap again for the rest\n", n)
				}
				return err
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&olderThan, "older-than", 0, "delete keys that finished longer ago than this, such as 24h (required)")
	f.IntVar(&batch, "batch-size", atomicphase.DefaultReapBatch, "keys deleted per statement")
	f.IntVar(&maxBatches, "max-batches", atomicphase.DefaultMaxReapBatches, "the most statements run")
	return cmd
}
