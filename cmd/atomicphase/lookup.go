package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) lookupCmd() *cobra.Command {
	var workflow string
	var phases []string
	cmd := &cobra.Command{
		Use:   "lookup SCOPE DOWNSTREAM_KEY --workflow W --phase P [--phase P2]",
		Short: "Find the key whose foreign phase sent a downstream key (a webhook's reference)",
		Long: strings.TrimSpace(`
Find the key whose foreign phase sent DOWNSTREAM_KEY to a downstream as its
idempotency key or reference (ForeignCall.Key): what a downstream's webhook
or support ticket quotes, when all you have is that. The downstream key is a
hash, so the CLI hashes the candidates: the keys of SCOPE of workflow W,
with each foreign phase named by --phase (by its oldest name, for a renamed
phase). It looks in SCOPE only: another tenant's keys are never searched.

A process that registered the workflow needs no names: Runner.FindDownstreamKey,
or the console's look-up box.`),
		Example: examples(`atomicphase lookup driver_7 9f2c61e0a4b8d3f5e7c9a1b2d4f6e8a0c2e4f6a8b0d2f4a6c8e0a2c4e6f8a0b2 --workflow create_ride --phase payout`),
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageErrorf("lookup takes two arguments, SCOPE and DOWNSTREAM_KEY; got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if workflow == "" || len(phases) == 0 {
				return usageErrorf("--workflow and at least one --phase are required: the CLI does not have your workflow's code to list its foreign phases")
			}
			scope, ref := args[0], args[1]
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				m, err := r.FindDownstreamKeyOf(cmd.Context(), scope, ref, workflow, phases...)
				if errors.Is(err, atomicphase.ErrDownstreamKeyNotFound) {
					return fmt.Errorf("no key of workflow %q in scope %q sent %q from phase %s (a key of another scope, or one forgotten or reaped, is not found)",
						workflow, scope, ref, strings.Join(phases, " or "))
				}
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(c.stdout, "key %s in scope %s (workflow %s, %s) sent it from phase %s\nnext: atomicphase inspect %s %s\n",
					terminalSafe(m.Key.Key), terminalSafe(scope), m.Key.Workflow, m.Key.Status, m.Phase,
					shellQuote(scope), shellQuote(m.Key.Key))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&workflow, "workflow", "", "the workflow whose keys to search")
	cmd.Flags().StringArrayVar(&phases, "phase", nil, "a foreign phase of the workflow (repeat for several)")
	return cmd
}
