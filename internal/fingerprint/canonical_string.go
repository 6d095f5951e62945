package fingerprint

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// string reads the string at c.pos and writes it in canonical form:
// escaped only where RFC 8785 says, which is '"', '\' and the controls below
// U+0020, those with a short escape (\b \t \n \f \r) by it and the rest as
// \u00xx. For a member name it returns the decoded name.
func (c *canonicaliser) string(isName bool) ([]byte, error) {
	in := c.in
	begin := len(c.out)
	c.out = append(c.out, '"')
	escaped := false // whether the canonical form holds an escape
	run := c.pos + 1 // the start of bytes to copy as they are
	for i := run; ; {
		if i == len(in) {
			c.pos = i
			return nil, c.unexpected()
		}
		switch b := in[i]; {
		case b == '"':
			c.out = append(c.out, in[run:i]...)
			c.out = append(c.out, '"')
			c.pos = i + 1
			if !isName {
				return nil, nil
			}
			name := c.out[begin+1 : len(c.out)-1 : len(c.out)-1]
			if escaped {
				return unescapeCanonical(name), nil
			}
			return name, nil
		case b == '\\':
			c.out = append(c.out, in[run:i]...)
			at := len(c.out)
			n, err := c.escape(i)
			if err != nil {
				return nil, err
			}
			escaped = escaped || bytes.IndexByte(c.out[at:], '\\') >= 0
			i += n
			run = i
		case b < 0x20:
			return nil, fmt.Errorf("control character U+%04X in a string at offset %d must be escaped", b, i)
		case b < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, fmt.Errorf("invalid UTF-8 in a string at offset %d", i)
			}
			i += size
		}
	}
}

// escape reads the escape sequence at in[i], writes its canonical form and
// returns the number of bytes it read.
func (c *canonicaliser) escape(i int) (int, error) {
	in := c.in
	if i+1 == len(in) {
		c.pos = len(in)
		return 0, c.unexpected()
	}
	switch e := in[i+1]; {
	case strings.IndexByte(escapeLetters, e) >= 0:
		c.out = append(c.out, '\\', e)
		return 2, nil
	case e == '/':
		c.out = append(c.out, '/')
		return 2, nil
	case e != 'u':
		return 0, fmt.Errorf("invalid escape %q in a string at offset %d", in[i:i+2], i)
	}
	r, ok := hex4(in, i+2)
	if !ok {
		return 0, fmt.Errorf("invalid \\u escape in a string at offset %d", i)
	}
	n := 6
	switch {
	case r == 0:
		return 0, fmt.Errorf(`string at offset %d holds U+0000 (\u0000), which PostgreSQL text cannot store`, i)
	case utf16.IsSurrogate(r):
		var low rune
		if r < 0xDC00 && i+12 <= len(in) && in[i+6] == '\\' && in[i+7] == 'u' {
			low, _ = hex4(in, i+8)
		}
		if low < 0xDC00 || low > 0xDFFF {
			return 0, fmt.Errorf(`string at offset %d holds the unpaired surrogate \u%04x, which is no character`, i, r)
		}
		r, n = utf16.DecodeRune(r, low), 12
	}
	c.appendRune(r)
	return n, nil
}

// hex4 reads the four hexadecimal digits at in[i:].
func hex4(in []byte, i int) (rune, bool) {
	if i+4 > len(in) {
		return 0, false
	}
	var r rune
	for _, h := range in[i : i+4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}

// The characters with a two-character escape, and the escapes' second
// characters: RFC 8785 writes these escapes, and \u00xx for the other
// characters below U+0020.
const (
	escapedChars  = "\"\\\b\f\n\r\t"
	escapeLetters = "\"\\bfnrt"
)

func (c *canonicaliser) appendRune(r rune) {
	const hex = "0123456789abcdef"
	switch k := strings.IndexRune(escapedChars, r); {
	case k >= 0:
		c.out = append(c.out, '\\', escapeLetters[k])
	case r < 0x20:
		c.out = append(c.out, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	default:
		c.out = utf8.AppendRune(c.out, r)
	}
}

// unescapeCanonical decodes a string's canonical form, whose only escapes
// are those appendRune writes, into a new slice.
func unescapeCanonical(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] != '\\':
			out = append(out, s[i])
		case s[i+1] == 'u':
			r, _ := hex4(s, i+2)
			out = append(out, byte(r))
			i += 5
		default:
			out = append(out, escapedChars[strings.IndexByte(escapeLetters, s[i+1])])
			i++
		}
	}
	return out
}
