// Package mdanchor names the anchors of a Markdown file's headings, as
// the repository's renderer makes them, for the tests that check the
// links into the docs.
package mdanchor

import (
	"strconv"
	"strings"
	"unicode"
)

// Anchors lists the anchors of markdown's headings, fenced code blocks
// aside: the heading's text in lower case, without punctuation but
// hyphens and underscores, spaces made hyphens; a repeated one gets -1,
// -2, ….
func Anchors(markdown string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(markdown, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		heading := strings.TrimLeft(line, "#")
		if inCode || heading == line || !strings.HasPrefix(heading, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
