package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// Every change the CLI makes to a key (resume, unpark, forget, resolve) is
// recorded in the key's audit trail, with who made it: ATOMICPHASE_ACTOR,
// else the login name ($USER, $LOGNAME), else "cli". inspect shows the
// trail.

// actor names who runs the CLI, for the audit trail.
func (c *cli) actor() string {
	for _, name := range []string{"ATOMICPHASE_ACTOR", "USER", "LOGNAME"} {
		if v := strings.TrimSpace(c.getenv(name)); v != "" {
			return v
		}
	}
	return "cli"
}

// audit records an action the CLI took on a key.
func (c *cli) audit(ctx context.Context, r *atomicphase.Runner, scope, key, action, note string, detail map[string]any) error {
	var raw []byte
	if detail != nil {
		var err error
		if raw, err = json.Marshal(detail); err != nil {
			return err
		}
	}
	err := r.RecordAudit(ctx, &atomicphase.AuditEntry{Scope: scope, Key: key, Actor: c.actor(), Action: action, Note: note, Detail: raw})
	if err != nil {
		return fmt.Errorf("%s done, but recording it in the audit trail failed: %w", action, err)
	}
	return nil
}

// writeAuditTrail prints a key's audit trail below its detail.
func writeAuditTrail(w io.Writer, trail []*atomicphase.AuditEntry) {
	if len(trail) == 0 {
		block(w, "audit trail", "- (no operator has acted on this key)")
		return
	}
	lines := make([]string, len(trail))
	for i, e := range trail {
		line := fmt.Sprintf("%s  %s  %s", timeCell(e.At), terminalSafe(e.Actor), terminalSafe(e.Action))
		if e.Note != "" {
			line += ": " + oneLine(terminalSafe(e.Note))
		}
		if len(e.Detail) > 0 {
			line += "  " + oneLine(terminalSafe(string(e.Detail)))
		}
		lines[i] = line
	}
	block(w, "audit trail (newest first)", strings.Join(lines, "\n"))
}
