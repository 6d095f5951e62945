package apui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase/internal/safetext"
)

// escapeControl escapes what a terminal or a page would obey (safetext.Escape).
func escapeControl(s string) string { return safetext.Escape(s) }

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

// shellWord writes s as one word of a command line an operator may paste
// into a shell: as it is when it holds only characters no shell reads
// specially, else in single quotes (a quote in it closed, escaped and
// reopened), with control characters written out. A scope or a key is a
// client's text: pasted as it is, "x; curl … | sh" would run.
// shellArgs writes args as the operands that end a command line an
// operator may paste, each a shellWord, after "--" when one starts with a
// dash (which the command would otherwise read as a flag): put the flags
// before them.
func shellArgs(args ...string) string {
	words := make([]string, 0, len(args)+1)
	for _, a := range args {
		if strings.HasPrefix(a, "-") && len(words) == 0 {
			words = append(words, "--")
		}
	}
	for _, a := range args {
		words = append(words, shellWord(a))
	}
	return strings.Join(words, " ")
}

func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return s
	}
	s = escapeControl(strings.ReplaceAll(s, "'", `'\''`))
	return "'" + strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", `\t`).Replace(s) + "'"
}
