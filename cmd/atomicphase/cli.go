package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

// Exit codes.
const (
	exitFailure = 1 // the command ran and failed: database, key, refusal
	exitUsage   = 2 // the command line itself is wrong: flags, arguments
)

// cli is one run of the command line: where it reads and writes, how it
// reads the environment (tests pass their own, so parallel tests need not
// share a process-wide DATABASE_URL), and the global flags.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	databaseURL string
	schema      string
	lockTimeout time.Duration
}

// run executes args and turns what went wrong into one message on stderr
// and an exit code.
func (c *cli) run(ctx context.Context, args []string) int {
	root := c.rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(c.stderr, "atomicphase: %v\n", err)
	var ue *usageError
	// cobra words an unknown subcommand itself; it is the one usage error
	// that does not pass through the flag or argument checks below.
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command ") {
		fmt.Fprintln(c.stderr, "Run 'atomicphase --help' (or 'atomicphase COMMAND --help') for usage.")
		return exitUsage
	}
	return exitFailure
}

func (c *cli) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "atomicphase",
		Short: "Operate an atomicphase idempotency key store",
		Long: strings.TrimSpace(`
Operate an atomicphase idempotency key store in PostgreSQL: apply the
schema, list and inspect keys, unpark, schedule or forget one, reap old
finished keys, and sweep once.

The CLI does not have your workflows' code, so it never runs a phase: keys
are resumed by the sweep (or a client retry) in a process that registered
their workflow. resume and unpark make a key eligible for that sweep at once.

Every command but migrate first checks that the database has the schema this
version needs, and says to run "atomicphase migrate" when it does not.`),
		Example: examples(
			`export DATABASE_URL=postgres://app@localhost:5432/app`,
			`atomicphase migrate`,
			`atomicphase keys --status parked`,
			`atomicphase inspect user_42 4f1c9a7e-checkout`,
			`atomicphase unpark user_42 4f1c9a7e-checkout`,
		),
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(*cobra.Command, []string) error { return c.checkGlobalFlags() },
	}
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })

	f := root.PersistentFlags()
	f.StringVar(&c.databaseURL, "database-url", "",
		"PostgreSQL URL or key=value string of the database holding the keys (default $DATABASE_URL)")
	f.StringVar(&c.schema, "schema", "",
		"schema holding the key table, as given to Migrate and Config.Schema (default: the connection's search_path)")
	f.DurationVar(&c.lockTimeout, "lock-timeout", atomicphase.DefaultLockTimeout,
		"the lease of keys locked by a release older than migration 007, which did not store it (newer keys carry their own)")

	root.AddCommand(c.migrateCmd(), c.keysCmd(), c.inspectCmd(), c.resumeCmd(), c.resolveCmd(),
		c.unparkCmd(), c.forgetCmd(), c.reapCmd(), c.sweepCmd(), c.uiCmd(), c.lookupCmd(), c.versionsCmd())
	return root
}

func (c *cli) checkGlobalFlags() error {
	if c.lockTimeout < time.Millisecond {
		return usageErrorf("--lock-timeout %s is too short; use at least 1ms, and the value your services give Config.LockTimeout", c.lockTimeout)
	}
	if c.databaseURL == "" {
		c.databaseURL = c.getenv("DATABASE_URL")
	}
	if c.databaseURL == "" {
		if file := c.getenv("DATABASE_URL_FILE"); file != "" {
			// A file keeps the password out of the environment and argv,
			// where other users of the machine may read it.
			b, err := os.ReadFile(file)
			if err != nil {
				return usageErrorf("DATABASE_URL_FILE: %v", err)
			}
			c.databaseURL = strings.TrimSpace(string(b))
		}
	}
	return nil
}

// usageError is a mistake in the command line, answered with exitUsage and
// a pointer to --help.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// noArgs and keyArgs check positional arguments, as usage errors.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}

func keyArgs(cmd *cobra.Command, args []string) error {
	if len(args) != 2 {
		return usageErrorf("%s takes two arguments, SCOPE and KEY; got %d", cmd.Name(), len(args))
	}
	return nil
}

// examples formats command lines for a command's Example, indented as cobra
// prints the rest of its help.
func examples(lines ...string) string {
	return "  " + strings.Join(lines, "\n  ")
}
