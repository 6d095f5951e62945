package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// resume and unpark both make a key due for the next sweep: unpark a
// parked key only (Runner.Unpark), resume any unfinished key (Runner.Unpark
// for a parked one, Runner.MakeDue, which clears a backoff, for another).

func (c *cli) resumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume SCOPE KEY",
		Short: "Schedule an unfinished key for the next sweep",
		Long: strings.TrimSpace(`
Schedule an unfinished key for the next sweep at once: clear its parked mark
and any backoff.

The CLI cannot run the key's phases: it does not have your workflow's code.
The next sweep of a process that registered the key's workflow (a Sweeper's
Run) resumes the key from its recovery point, through the normal
acquisition path; a client retry with the same key would too. resume returns
as soon as the key is scheduled, without waiting for that sweep. If the
phase that failed still fails, the key is retried with backoff and parked
again after Config.MaxAttempts attempts.`),
		Example: examples(`atomicphase resume user_42 4f1c9a7e-checkout`),
		Args:    keyArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.unpark(cmd.Context(), "resume", args[0], args[1], false, func(before *atomicphase.KeyInfo) string {
				msg := fmt.Sprintf("key scheduled: the next sweep of a process that registered workflow %q resumes it", before.Workflow)
				msg += fmt.Sprintf(" after recovery point %q", before.RecoveryPoint)
				switch before.Status {
				case atomicphase.KeyInProgress:
					msg += "\nnote: an attempt holds the key right now; the sweep leaves it alone until that attempt ends or its lock goes stale"
				case atomicphase.KeyStale:
					msg += "\nnote: the key's lock is stale; the sweep takes it over"
				}
				return msg
			})
		},
	}
}

func (c *cli) unparkCmd() *cobra.Command {
	var b bulkFlags
	var yes bool
	cmd := &cobra.Command{
		Use:   "unpark (SCOPE KEY | --workflow W --older-than D --error-contains T [--dry-run])",
		Short: "Clear a key's parked mark so the sweep tries it again",
		Long: strings.TrimSpace(`
Clear a parked key's mark (and any backoff), once whatever made it fail
permanently is fixed, and give it a fresh budget of attempts: the next sweep
of a process that registered the key's workflow resumes it. A key that is
not parked is refused, unchanged (resume clears its backoff). A finished key
cannot be unparked; forget it instead to drop its stored response.

Given no SCOPE KEY but filters, unpark acts on every parked key they select,
at most --limit of them, oldest first, after asking (unless --yes);
--dry-run lists them and changes nothing.`),
		Example: examples(
			`atomicphase unpark user_42 4f1c9a7e-checkout`,
			`atomicphase unpark --workflow create_ride --error-contains "42P05" --dry-run`,
		),
		Args: keyOrFilterArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bulk, err := b.bulk(args)
			switch {
			case err != nil:
				return err
			case bulk:
				return c.runBulk(cmd.Context(), &b, yes, "unparked", atomicphase.BulkOpts{}, (*atomicphase.Runner).UnparkKeys)
			}
			return c.unpark(cmd.Context(), "unpark", args[0], args[1], true, func(before *atomicphase.KeyInfo) string {
				return fmt.Sprintf("key unparked: the next sweep of a process that registered workflow %q resumes it after recovery point %q",
					before.Workflow, before.RecoveryPoint)
			})
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "with no SCOPE KEY: do not ask for confirmation")
	b.add(cmd, "with no SCOPE KEY: parked (the only status unpark acts on in bulk)")
	return cmd
}

// unpark makes a key due (a parked one only, with parkedOnly), records
// action in its audit trail, and prints what say makes of the key as it
// was.
func (c *cli) unpark(ctx context.Context, action, scope, key string, parkedOnly bool, say func(before *atomicphase.KeyInfo) string) error {
	return c.withRunner(ctx, func(r *atomicphase.Runner) error {
		before, err := r.Inspect(ctx, scope, key)
		switch {
		case err != nil:
		case parkedOnly || before.Status == atomicphase.KeyParked:
			err = r.Unpark(ctx, scope, key)
		default:
			err = r.MakeDue(ctx, scope, key)
		}
		switch {
		case errors.Is(err, atomicphase.ErrKeyNotParked):
			return fmt.Errorf("key %q in scope %q is not parked (it is %s): nothing to unpark, and its attempts stay as they are "+
				"(to clear its backoff, use `atomicphase resume`)", key, scope, before.Status)
		case errors.Is(err, atomicphase.ErrKeyParked):
			// Parked between the read and the action: say so, as the
			// key now is.
			return fmt.Errorf("key %q in scope %q was parked meanwhile: run the command again", key, scope)
		case errors.Is(err, atomicphase.ErrKeyNotFound):
			return keyNotFound(scope, key)
		case errors.Is(err, atomicphase.ErrKeyFinished):
			return fmt.Errorf("key %q in scope %q is finished: its stored response is replayed and nothing is left to resume "+
				"(to drop the response, use `atomicphase forget`)", key, scope)
		case err != nil:
			return err
		}
		if err := c.audit(ctx, r, scope, key, action, "", map[string]any{"status_before": before.Status}); err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.stdout, say(before))
		return err
	})
}
