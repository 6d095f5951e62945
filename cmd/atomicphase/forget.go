package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) forgetCmd() *cobra.Command {
	var yes bool
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

Given no SCOPE KEY but filters, forget acts on every key they select (parked
keys unless --status finished is given), at most --limit of them, oldest
first; --dry-run lists them and changes nothing.

forget asks for confirmation on standard input unless --yes is given.`),
		Example: examples(
			`atomicphase forget user_42 4f1c9a7e-checkout`,
			`atomicphase forget user_42 4f1c9a7e-checkout --yes`,
			`atomicphase forget --workflow create_ride --error-contains "check constraint" --dry-run`,
			`atomicphase forget --status parked --older-than 72h --yes`,
		),
		Args: keyOrFilterArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bulk, err := b.bulk(args)
			switch {
			case err != nil:
				return err
			case bulk:
				return c.runBulk(cmd.Context(), &b, yes, "forgotten", (*atomicphase.Runner).ForgetKeys)
			}
			return c.forget(cmd.Context(), args[0], args[1], yes)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	b.add(cmd, "with no SCOPE KEY: parked (the default) or finished")
	return cmd
}

func (c *cli) forget(ctx context.Context, scope, key string, yes bool) error {
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
		if !yes {
			fmt.Fprintf(c.stderr, "Forget %s key %q in scope %q (workflow %q, created %s)? A retry with this key will run as a new request. [y/N] ",
				info.Status, key, scope, info.Workflow, timeCell(info.CreatedAt))
			answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
			if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
				return errors.New("not confirmed: nothing deleted (answer y, or pass --yes)")
			}
		}
		err = r.Forget(ctx, scope, key)
		switch {
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
		if err := c.audit(ctx, r, scope, key, "forget", "", map[string]any{"status_before": info.Status}); err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.stdout, "forgot %s key %q in scope %q\n", info.Status, key, scope)
		return err
	})
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
