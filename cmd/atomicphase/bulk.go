package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// forget and unpark act on one key (SCOPE KEY) or, given no arguments and
// at least one filter, on every key the filter selects: the bulk mode,
// which --dry-run turns into a listing of what it would touch.

// bulkFlags are the filter and the dry run of a bulk forget or unpark.
type bulkFlags struct {
	status    string
	filter    atomicphase.KeyFilter
	olderThan time.Duration
	dryRun    bool
	cmd       *cobra.Command
}

// add adds the flags to cmd.
func (b *bulkFlags) add(cmd *cobra.Command, statusHelp string) {
	b.cmd = cmd
	f := cmd.Flags()
	f.StringVar(&b.status, "status", "", statusHelp)
	f.StringVar(&b.filter.Workflow, "workflow", "", "with no SCOPE KEY: only keys of this workflow")
	f.StringVar(&b.filter.Scope, "scope", "", "with no SCOPE KEY: only keys of this scope")
	f.DurationVar(&b.olderThan, "older-than", 0, "with no SCOPE KEY: only keys created longer ago than this, such as 24h")
	f.StringVar(&b.filter.ErrorContains, "error-contains", "", "with no SCOPE KEY: only keys whose last error contains this text")
	f.IntVar(&b.filter.Limit, "limit", atomicphase.DefaultListLimit, "with no SCOPE KEY: the most keys acted on, oldest first")
	f.BoolVar(&b.dryRun, "dry-run", false, "with no SCOPE KEY: list the keys that would be acted on, and change nothing")
}

// keyOrFilterArgs allows SCOPE KEY, or no arguments (the bulk mode; bulk
// checks the combination).
func keyOrFilterArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 2 {
		return usageErrorf("%s takes two arguments, SCOPE and KEY; got %d (or none, with filters, to act on every key they select)", cmd.Name(), len(args))
	}
	return nil
}

// bulk reports whether the command runs in the bulk mode, and checks its
// arguments: SCOPE KEY without filters, or filters without arguments.
func (b *bulkFlags) bulk(args []string) (bool, error) {
	changed := false
	for _, name := range []string{"status", "workflow", "scope", "older-than", "error-contains", "limit", "dry-run"} {
		changed = changed || b.cmd.Flags().Changed(name)
	}
	switch {
	case len(args) == 0 && !changed:
		return false, usageErrorf("%s takes SCOPE and KEY, or, for every key a filter selects, no arguments and at least one of --workflow, --status, --scope, --older-than, --error-contains", b.cmd.Name())
	case len(args) == 0:
		if b.olderThan < 0 {
			return false, usageErrorf("--older-than %s is negative; give an age such as 24h", b.olderThan)
		}
		if b.filter.Limit <= 0 {
			return false, usageErrorf("--limit %d: give a positive number of keys", b.filter.Limit)
		}
		b.filter.OlderThan = b.olderThan
		b.filter.Status = atomicphase.KeyStatus(b.status)
		if b.status != "" && !slices.Contains(atomicphase.KeyStatuses(), b.filter.Status) {
			return false, usageErrorf("--status %q is not a key status; use one of %s", b.status, statusList())
		}
		return true, nil
	case changed:
		return false, usageErrorf("%s SCOPE KEY acts on that key alone: leave out the filter flags, or the arguments", b.cmd.Name())
	}
	return false, keyArgs(b.cmd, args)
}

// runBulk lists, and unless it is a dry run acts on, the keys the filter
// selects: act is Runner.ForgetKeys or Runner.UnparkKeys; verb says what it
// does, for the report. Without --yes a real run asks for confirmation
// first, naming how many keys.
func (c *cli) runBulk(ctx context.Context, b *bulkFlags, yes bool, verb string, opts atomicphase.BulkOpts,
	act func(*atomicphase.Runner, context.Context, *atomicphase.KeyFilter, *atomicphase.BulkOpts) ([]*atomicphase.KeyInfo, error)) error {
	return c.withRunner(ctx, func(r *atomicphase.Runner) error {
		dry := opts
		dry.DryRun = true
		keys, err := act(r, ctx, &b.filter, &dry)
		if err != nil {
			return err
		}
		switch {
		case b.dryRun:
			if err := c.writeKeyTable(keys); err != nil {
				return err
			}
			if verb == "forgotten" && !opts.Force {
				if err := c.writeUnsettled(keys); err != nil {
					return err
				}
			}
			_, err := fmt.Fprintf(c.stdout, "dry run: %d keys would be %s; nothing changed\n", len(keys), verb)
			return err
		case len(keys) == 0:
			_, err := fmt.Fprintf(c.stdout, "no keys match: none %s\n", verb)
			return err
		}
		if !yes {
			fmt.Fprintf(c.stderr, "%d keys match (the oldest first: %s %s). %s them all? [y/N] ",
				len(keys), keys[0].Scope, keys[0].Key, capitalize(verb))
			answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
			if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
				return errors.New("not confirmed: nothing changed (answer y, or pass --yes; --dry-run lists the keys)")
			}
		}
		done, err := act(r, ctx, &b.filter, &opts)
		if err != nil {
			return err
		}
		if err := c.writeKeyTable(done); err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.stdout, "%d keys %s\n", len(done), verb)
		return err
	})
}

// writeUnsettled names the keys of a forget's dry run that the forget
// will skip: those that may have paid without knowing it, and finished
// keys that may have paid.
func (c *cli) writeUnsettled(keys []*atomicphase.KeyInfo) error {
	unsettled, paid := 0, 0
	for _, k := range keys {
		var err error
		switch {
		case k.Unsettled:
			unsettled++
			_, err = fmt.Fprintf(c.stdout, "UNSETTLED %s %s: its call's outcome is unknown or the call may be in flight; it will be skipped\n", k.Scope, k.Key)
		case k.Paid:
			paid++
			_, err = fmt.Fprintf(c.stdout, "PAID %s %s: it finished after a foreign call that may have paid; it will be skipped\n", k.Scope, k.Key)
		}
		if err != nil {
			return err
		}
	}
	if unsettled > 0 {
		if _, err := fmt.Fprintf(c.stdout, "%d of these keys may have paid without knowing it: forgetting one lets a retry pay again. Record a verdict (atomicphase resolve), or pass --force --reason \"...\" (kept in each key's audit trail)\n", unsettled); err != nil {
			return err
		}
	}
	if paid > 0 {
		if _, err := fmt.Fprintf(c.stdout, "%d of these keys finished after a foreign call that may have paid: forgetting one lets its client's retry pay again. Leave them to the reaper, or pass --force --reason \"...\" (kept in each key's audit trail)\n", paid); err != nil {
			return err
		}
	}
	return nil
}

// capitalize is the imperative of a bulk action's past participle, for
// the prompt.
func capitalize(verb string) string {
	switch verb {
	case "forgotten":
		return "Forget"
	case "unparked":
		return "Unpark"
	}
	return verb
}
