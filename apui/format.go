package apui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// escapeControl makes client-supplied text safe to show: every control
// character but newline and tab (ESC and the rest of C0, DEL, C1) and
// every invalid byte is written as a Go escape, so an ESC or OSC sequence
// stored in an error or a body is shown, never obeyed by a terminal nor
// hidden by a browser. A carriage return is escaped too: it would let text
// overwrite the line before it.
func escapeControl(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// errorLines formats a stored error for reading: an error that carries a
// panic's stack with its newlines escaped (as text that went through a
// JSON or %q encoding does) gets them back, and then every control
// character is escaped.
func errorLines(s string) string {
	if !strings.Contains(s, "\n") && strings.Count(s, `\n`) >= 2 {
		s = strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace(s)
	}
	return escapeControl(s)
}

// showJSON indents JSON for reading, and escapes anything else.
func showJSON(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") == nil {
		return escapeControl(out.String())
	}
	return showBody(b)
}

// showBody shows a stored body: text as text, with control characters
// escaped; JSON indented; anything else as a count of bytes and their
// start in hex.
func showBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if json.Valid(b) {
		var out bytes.Buffer
		if json.Indent(&out, b, "", "  ") == nil {
			return escapeControl(out.String())
		}
	}
	if utf8.Valid(b) {
		return escapeControl(string(b))
	}
	n := min(len(b), 64)
	return fmt.Sprintf("(%d bytes, not text) % x…", len(b), b[:n])
}
