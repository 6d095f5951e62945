package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) forgetCmd() *cobra.Command {
	var yes, force bool
	var reason string
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "forget (SCOPE KEY | --workflow W --status S --older-than D --error-contains T [--dry-run])",
		Short: "Delete a finished or parked key",
		Long: strings.TrimSpace(`
Delete a finished or parked key: a stored response produced by a since-fixed
bug is then no longer replayed, or a parked request is given up. The same
client key becomes a new request, with new downstream idempotency keys;
nothing the earlier phases did is undone or re-linked.

Keys in progress, stale or abandoned are refused: their phases have done
part of the work, and forgetting them would strand it. Let them finish, or
wait until they are parked.

A parked key whose foreign call's outcome is unknown, or whose call may
still be in flight, is refused too (the bulk mode skips it, and --dry-run
marks it UNSETTLED): a retry after the forget would run as a new request
and could pay twice. Record a verdict with resolve once the downstream
says what happened, or, having settled it some other way, pass --force
with --reason; the reason, who forced it and the key's downstream
references go to the key's audit trail.

So is a finished key that may have made a foreign call (--dry-run marks it
PAID): its client's retry would run as a new request and pay again. The
CLI has not your workflows' code, so it cannot tell a workflow that makes
no foreign call: every finished key needs --force --reason here. The
reaper deletes finished keys after their retention all the same.

Given no SCOPE KEY but filters, forget acts on every key they select (parked
keys unless --status finished is given), at most --limit of them, oldest
first; --dry-run lists them and changes nothing.

forget asks for confirmation on standard input unless --yes is given.`),
		Example: examples(
			`atomicphase forget user_42 4f1c9a7e-checkout`,
			`atomicphase forget user_42 4f1c9a7e-checkout --yes`,
			`atomicphase forget --workflow create_ride --error-contains "check constraint" --dry-run`,
			`atomicphase forget --status parked --older-than 72h --yes`,
			`atomicphase forget user_42 payout-7 --force --reason "bank confirmed po_123 by phone"`,
		),
		Args: keyOrFilterArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bulk, err := b.bulk(args)
			switch {
			case err != nil:
				return err
			case force && strings.TrimSpace(reason) == "":
				return usageErrorf("--force needs --reason: why the keys' outcomes are settled, for the audit trail")
			case !force && reason != "":
				return usageErrorf("--reason goes with --force")
			case bulk:
				opts := atomicphase.BulkOpts{Force: force, Reason: reason, Actor: c.actor()}
				return c.runBulk(cmd.Context(), &b, yes, "forgotten", opts, (*atomicphase.Runner).ForgetKeys)
			}
			return c.forget(cmd.Context(), args[0], args[1], yes, force, reason)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&force, "force", false, "forget keys whose call's outcome is unknown or whose call may be in flight, and finished keys that may have paid, too (needs --reason)")
	cmd.Flags().StringVar(&reason, "reason", "", "with --force: why the outcome is settled, recorded in the audit trail")
	b.add(cmd, "with no SCOPE KEY: parked (the default) or finished")
	return cmd
}

func (c *cli) forget(ctx context.Context, scope, key string, yes, force bool, reason string) error {
	return c.withRunner(ctx, func(r *atomicphase.Runner) error {
		info, err := r.Inspect(ctx, scope, key)
		if errors.Is(err, atomicphase.ErrKeyNotFound) {
			return keyNotFound(scope, key)
		}
		if err != nil {
			return err
		}
		if err := forgettable(info); err != nil {
			return err
		}
		switch {
		case info.Unsettled && !force:
			return unsettled(info)
		case info.Paid && !force:
			return paid(info)
		}
		if !yes {
			fmt.Fprintf(c.stderr, "Forget %s key %q in scope %q (workflow %q, created %s)? A retry with this key will run as a new request. [y/N] ",
				info.Status, key, scope, info.Workflow, timeCell(info.CreatedAt))
			answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
			if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
				return errors.New("not confirmed: nothing deleted (answer y, or pass --yes)")
			}
		}
		if force {
			err = r.ForgetForced(ctx, scope, key, c.actor(), reason)
		} else {
			err = r.Forget(ctx, scope, key)
		}
		switch {
		case errors.Is(err, atomicphase.ErrOutcomeUnsettled):
			return unsettled(info)
		case errors.Is(err, atomicphase.ErrKeyPaid):
			return paid(info)
		case errors.Is(err, atomicphase.ErrKeyNotFound):
			return keyNotFound(scope, key)
		case errors.Is(err, atomicphase.ErrKeyUnfinished):
			// It changed since we looked: a client retry took it, say.
			now, ierr := r.Inspect(ctx, scope, key)
			if ierr != nil {
				return err
			}
			if ferr := forgettable(now); ferr != nil {
				return ferr
			}
			return err
		case err != nil:
			return err
		}
		if !force { // ForgetForced recorded its own entry
			if err := c.audit(ctx, r, scope, key, "forget", "", map[string]any{"status_before": info.Status}); err != nil {
				return err
			}
		}
		_, err = fmt.Fprintf(c.stdout, "forgot %s key %q in scope %q\n", info.Status, key, scope)
		return err
	})
}

// unsettled is the refusal to forget a key that may have paid without
// knowing it.
func unsettled(k *atomicphase.KeyInfo) error {
	return fmt.Errorf("key %q in scope %q is parked with its call's outcome unknown or the call possibly in flight: forgetting it lets a retry run as a new request and pay again. Ask the downstream (references: %s) and record a verdict with resolve, or pass --force --reason \"...\"",
		k.Key, k.Scope, references(k))
}

// paid is the refusal to forget a finished key that may have made a
// foreign call.
func paid(k *atomicphase.KeyInfo) error {
	return fmt.Errorf("key %q in scope %q finished after a foreign call that may have paid (references: %s): forgetting it lets the client's retry run as a new request and pay again. "+
		"Leave it to the reaper, or pass --force --reason \"...\" if a second payment is what you mean",
		k.Key, k.Scope, references(k))
}

// references lists a key's downstream keys, phase=key, for an operator
// to look up.
func references(k *atomicphase.KeyInfo) string {
	refs := make([]string, 0, len(k.DownstreamKeys))
	for phase, ref := range k.DownstreamKeys {
		refs = append(refs, phase+"="+ref)
	}
	slices.Sort(refs)
	if len(refs) == 0 {
		return "see the key's downstream keys in its workflow's service"
	}
	return strings.Join(refs, ", ")
}

// forgettable says why a key may not be forgotten, or nil if it may.
func forgettable(k *atomicphase.KeyInfo) error {
	refuse := func(why string) error {
		return fmt.Errorf("key %q in scope %q is %s, and only finished and parked keys can be forgotten: %s", k.Key, k.Scope, k.Status, why)
	}
	switch k.Status {
	case atomicphase.KeyFinished, atomicphase.KeyParked:
		return nil
	case atomicphase.KeyInProgress:
		return refuse("an attempt is running its phases now, and forgetting the key would strand what they do")
	case atomicphase.KeyStale:
		return refuse("its phases did part of the work before its holder stopped, which forgetting the key would strand; the next client retry or sweep takes it over and finishes it")
	default:
		return refuse("its phases did part of the work, which forgetting the key would strand; let the sweep or a client retry finish it, or wait until it is parked")
	}
}
