package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// writeHistory prints a key's history, oldest first, as a timeline: when,
// what happened, the state it moved the key between, the recovery point,
// the attempt and its lock token, and why an attempt failed.
func writeHistory(w io.Writer, events []*atomicphase.KeyEvent, missing bool) {
	switch {
	case missing:
		block(w, "history", "- (this schema keeps none: run atomicphase migrate)")
		return
	case len(events) == 0:
		block(w, "history", "- (nothing went wrong with this key)")
		return
	}
	lines := make([]string, len(events))
	for i, e := range events {
		line := fmt.Sprintf("%s  %-10s  %s -> %s  at %s  attempt %d  token %d", timeCell(e.At), e.Event,
			e.StatusBefore, e.Status, terminalSafe(e.RecoveryPoint), e.Attempt, e.LockToken)
		if e.Error != nil {
			line += ": " + oneLine(terminalSafe(*e.Error))
		}
		lines[i] = line
	}
	block(w, "history (oldest first)", strings.Join(lines, "\n"))
}
