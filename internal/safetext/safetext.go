// Package safetext makes text a client or a downstream supplied safe to
// show an operator, in a terminal (the CLI) or a page (the console).
package safetext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Escape writes every control character but newline and tab (ESC, BEL, a
// carriage return that would overwrite the line, DEL, the C1 codes, the
// Unicode line and paragraph separators) and every byte that is not UTF-8
// as a Go escape (\xNN or \uNNNN), so an OSC or CSI sequence in a stored
// error or body is shown, never obeyed by a terminal nor hidden by a
// browser.
func Escape(s string) string {
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
