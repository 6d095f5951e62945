package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) inspectCmd() *cobra.Command {
	var asJSON bool
	var phases []string
	cmd := &cobra.Command{
		Use:   "inspect SCOPE KEY [--phase P]...",
		Short: "Show everything stored for one key",
		Long: strings.TrimSpace(`
Show everything stored for one key, without locking or changing it: its
status, recovery point, lock, attempts, last error (whole), backoff, parked
mark, timestamps, state as stored, the stored response once finished, its
history (what went wrong with it: each failed attempt and why, each take,
park, unpark and verdict, oldest first) and its audit trail.

The response body is shown as text when it is UTF-8, and as base64 otherwise
(--json says which in body_encoding).

With --phase, it shows the downstream key (ForeignCall.Key) each foreign
phase named sends: the reference a downstream knows the call by, which a
partner asks for first. The CLI does not have your workflows' code, so it
cannot tell which phases are foreign: name them (by their oldest name, for
a renamed phase). A console mounted in your service shows them all.`),
		Example: examples(
			`atomicphase inspect user_42 4f1c9a7e-checkout`,
			`atomicphase inspect user_42 4f1c9a7e-checkout --json | jq .state`,
			`atomicphase inspect user_42 4f1c9a7e-checkout --phase charge`,
		),
		Args: keyArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			scope, key := args[0], args[1]
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				info, err := r.InspectWithPhases(cmd.Context(), scope, key, phases...)
				if errors.Is(err, atomicphase.ErrKeyNotFound) {
					return keyNotFound(scope, key)
				}
				if err != nil {
					return err
				}
				trail, err := r.AuditTrail(cmd.Context(), scope, key, 0)
				if err != nil {
					return err
				}
				// A schema before migration 019 has no history: the rest
				// is shown, and the history says so.
				history, err := r.KeyHistory(cmd.Context(), scope, key, 0)
				noHistory := errors.Is(err, atomicphase.ErrSchemaMissing)
				if err != nil && !noHistory {
					return err
				}
				if asJSON {
					d := detail(info)
					d.Audit, d.History = trail, history
					return writeJSONLine(c.stdout, d)
				}
				if err := writeKeyDetail(c.stdout, info); err != nil {
					return err
				}
				writeHistory(c.stdout, history, noHistory)
				writeAuditTrail(c.stdout, trail)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	cmd.Flags().StringArrayVar(&phases, "phase", nil, "a foreign phase whose downstream key to show (repeat for several)")
	return cmd
}

// writeKeyDetail prints a key as aligned "field: value" lines, then the
// state and the response body, which may be long, as indented blocks.
func writeKeyDetail(w io.Writer, k *atomicphase.KeyInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	field("scope", cell(k.Scope))
	field("key", cell(k.Key))
	field("workflow", cell(k.Workflow))
	if k.WorkflowVersion != "" {
		field("workflow version", cell(k.WorkflowVersion))
	}
	field("status", string(k.Status))
	field("recovery point", cell(k.RecoveryPoint))
	lock := "no"
	if k.Locked {
		lock = "yes"
		if k.LockExpiresIn != nil {
			if d := seconds(*k.LockExpiresIn); d >= 0 {
				lock += ", goes stale in " + d.String()
			} else {
				lock += ", stale for " + (-d).String()
			}
		}
	}
	field("locked", lock)
	field("lock token", strconv.FormatInt(k.LockToken, 10))
	field("attempts", strconv.Itoa(k.Attempts))
	// The last error may hold a panic's stack (many lines) and text a client
	// sent (a name, a reference) with terminal escapes in it: its first line
	// goes here, escaped, and the whole of it in a block below.
	lastErr, errLines := "-", []string(nil)
	if k.LastError != nil {
		errLines = strings.Split(strings.TrimRight(terminalSafe(*k.LastError), "\n"), "\n")
		lastErr = errLines[0]
		if len(errLines) > 1 {
			lastErr += fmt.Sprintf(" (%d more lines below)", len(errLines)-1)
		}
	}
	field("last error", lastErr)
	field("next attempt at", timePtrCell(k.NextAttemptAt))
	field("parked at", timePtrCell(k.ParkedAt))
	field("outcome unknown since", timePtrCell(k.UnknownAt))
	if k.Unsettled {
		// Only shown when it matters: what makes forget refuse the key.
		field("unsettled", "yes: it may have paid; forget refuses it (see resolve, or forget --force --reason)")
		if k.CalledAt != nil {
			field("called out since", timePtrCell(k.CalledAt))
		}
		if k.DownstreamSalt != "" {
			field("downstream salt", k.DownstreamSalt)
		}
	}
	if k.ResolvedHappened != nil {
		verdict := "did not happen"
		if *k.ResolvedHappened {
			verdict = "happened"
		}
		note := ""
		if k.ResolvedNote != nil {
			note = oneLine(terminalSafe(*k.ResolvedNote))
		}
		field("resolved by hand", fmt.Sprintf("%s at %s: %s", verdict, timePtrCell(k.ResolvedAt), note))
	}
	phases := make([]string, 0, len(k.DownstreamKeys))
	for p := range k.DownstreamKeys {
		phases = append(phases, p)
	}
	slices.Sort(phases)
	for _, p := range phases {
		field("downstream key ("+cell(p)+")", k.DownstreamKeys[p])
	}
	field("created at", timeCell(k.CreatedAt))
	field("updated at", timeCell(k.UpdatedAt))
	field("finished at", timePtrCell(k.FinishedAt))
	if k.Response != nil {
		field("response status", strconv.Itoa(k.Response.Status))
		names := make([]string, 0, len(k.Response.Header))
		for name := range k.Response.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range k.Response.Header[name] {
				field("response header", terminalSafe(name)+": "+oneLine(terminalSafe(v)))
			}
		}
	} else {
		field("response", "- (not finished)")
	}
	if k.State == nil {
		field("state", "- (cleared once finished)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(errLines) > 1 {
		block(w, "last error (whole)", strings.Join(errLines, "\n"))
	}
	if k.State != nil {
		block(w, "state (as stored)", terminalSafe(string(k.State)))
	}
	if k.Response != nil {
		body, enc := bodyText(k.Response.Body)
		block(w, fmt.Sprintf("response body (%s, %d bytes)", enc, len(k.Response.Body)), terminalSafe(body))
	}
	return nil
}

// seconds converts LockExpiresIn to a duration, to a tenth of a second.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond)
}

// block prints a title and text indented below it.
func block(w io.Writer, title, text string) {
	fmt.Fprintf(w, "%s:\n", title)
	if text == "" {
		text = "(empty)"
	}
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(w, "  %s\n", line)
	}
}
