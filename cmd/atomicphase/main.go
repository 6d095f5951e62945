// Command atomicphase is the operator's tool for an atomicphase key store:
// it migrates the schema, lists and inspects idempotency keys, unparks,
// schedules and forgets them, and reaps or sweeps the table once. It runs no
// workflow's phases (it does not have the code); see README.md.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args (without the program's name), reading
// answers to prompts from standard input and DATABASE_URL from the
// environment, and returns the exit code: 0, exitFailure or exitUsage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return c.run(ctx, args)
}
