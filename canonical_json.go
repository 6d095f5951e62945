package atomicphase

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxJSONDepth is how deeply CanonicalJSON lets arrays and objects nest; a
// document nested deeper is an error. Request parameters nest a few levels,
// so 128 refuses no real request; it is serde_json's default limit too, and
// below encoding/json's 10 000, so whatever CanonicalJSON accepts the
// Runner can decode. The limit bounds the canonicaliser's stack and its
// worst case: putting members in order moves a byte once for each object
// around it, so no document costs more than 128 passes over it.
const MaxJSONDepth = 128

// CanonicalJSON returns the RFC 8785 canonical form of a JSON document:
// members sorted by the UTF-16 code units of their names, insignificant
// whitespace removed, strings escaped only where they must be, numbers
// written the way ECMAScript writes the double they name. Empty or
// all-whitespace input canonicalises to empty output.
//
// It accepts only documents that every later reader sees the way the
// canonical form does, and returns an error for
//
//   - arrays and objects nested deeper than MaxJSONDepth, answered as soon
//     as the limit is passed;
//   - a number not numerically equal to the shortest form of the double
//     closest to it, so that two numbers naming one double could differ:
//     9007199254740993, 0.10000000000000000001 and 1e-400 are errors, 0.1,
//     1.50 and 15e-1 (all written 1.5) are not. Such numbers must be sent
//     as strings. A number beyond the double range (1e400) is an error too;
//   - an object with two member names equal under Unicode simple case
//     folding (strings.EqualFold), exact duplicates included, at any depth,
//     since encoding/json matches names to fields ignoring case;
//   - a string or member name holding U+0000, which PostgreSQL text cannot
//     store, or an unpaired surrogate escape such as "\ud800", which is no
//     character (encoding/json would quietly read U+FFFD);
//   - anything else that is not one JSON value in valid UTF-8, trailing
//     data included.
//
// It reads the document once, in time linear in its length: objects out of
// order are rewritten in place, which for objects nested in objects
// multiplies the work by at most twice MaxJSONDepth.
func CanonicalJSON(doc []byte) ([]byte, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	// The output is about as long as the input, and reordering an object
	// uses the space after it as scratch: room for both, for the bodies of
	// most requests.
	var members [16]member
	c := canonicaliser{in: doc, out: make([]byte, 0, len(doc)+min(len(doc), 64<<10)), members: members[:0]}
	if err := c.value(0); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	c.skipSpace()
	if c.pos < len(c.in) {
		return nil, fmt.Errorf("canonical json: trailing data after the document at offset %d", c.pos)
	}
	return c.out, nil
}

// canonicaliser is a recursive-descent parser that writes the canonical
// form as it reads; it recurses once per level of nesting, at most
// MaxJSONDepth times.
type canonicaliser struct {
	in  []byte
	pos int // the next byte of in to read
	out []byte
	// members holds the members of every open object, innermost last.
	members []member
}

// member is one "name":value of an object, written to out[start:end].
// name is the decoded name, used for ordering and duplicate checks. It
// points into out itself when the name needed no escapes: those bytes are
// never rewritten while the object is open (reordering a nested object only
// moves bytes inside that object's value), and if out grows, the old array
// still holds them.
type member struct {
	name       []byte
	start, end int
}

func (c *canonicaliser) value(depth int) error {
	c.skipSpace()
	if c.pos == len(c.in) {
		return c.unexpected()
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		_, err := c.string(false)
		return err
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return c.unexpected()
}

func (c *canonicaliser) array(depth int) error {
	if depth > MaxJSONDepth {
		return c.tooDeep()
	}
	c.pos++
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.peek() == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		switch c.peek() {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return c.expected("',' or ']'")
		}
	}
}

func (c *canonicaliser) object(depth int) error {
	if depth > MaxJSONDepth {
		return c.tooDeep()
	}
	c.pos++
	c.out = append(c.out, '{')
	start, first := len(c.out), len(c.members)
	c.skipSpace()
	if c.peek() == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}
	for {
		c.skipSpace()
		if c.peek() != '"' {
			return c.expected("a member name")
		}
		m := member{start: len(c.out)}
		name, err := c.string(true)
		if err != nil {
			return err
		}
		m.name = name
		c.skipSpace()
		if c.peek() != ':' {
			return c.expected("':'")
		}
		c.pos++
		c.out = append(c.out, ':')
		if err := c.value(depth); err != nil {
			return err
		}
		m.end = len(c.out)
		c.members = append(c.members, m)
		c.skipSpace()
		switch c.peek() {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case '}':
			c.pos++
			err := c.sortMembers(start, c.members[first:])
			c.members = c.members[:first]
			c.out = append(c.out, '}')
			return err
		default:
			return c.expected("',' or '}'")
		}
	}
}

// sortMembers checks the names of an object's members, ms, and puts the
// members, written to out[start:], in canonical order.
func (c *canonicaliser) sortMembers(start int, ms []member) error {
	sorted := slices.IsSortedFunc(ms, byName) // before checkNames reorders ms
	if err := checkNames(ms); err != nil {
		return err
	}
	if sorted {
		return nil
	}
	slices.SortFunc(ms, byName)
	// Copy the members past the end of out and write them back in order.
	end := len(c.out)
	c.out = append(c.out, c.out[start:end]...)
	w := start
	for i, m := range ms {
		if i > 0 {
			c.out[w] = ','
			w++
		}
		w += copy(c.out[w:], c.out[end+m.start-start:end+m.end-start])
	}
	c.out = c.out[:end]
	return nil
}

func byName(a, b member) int { return compareUTF16(a.name, b.name) }

// checkNames reports two names equal ignoring case, the way encoding/json
// matches names to fields (bytes.EqualFold: Unicode simple folding). Small
// objects are checked pairwise; large ones are sorted by folded name, which
// reorders ms.
func checkNames(ms []member) error {
	if len(ms) <= 16 {
		for i := 1; i < len(ms); i++ {
			for j := range i {
				if bytes.EqualFold(ms[j].name, ms[i].name) {
					return duplicateNames(ms[j].name, ms[i].name)
				}
			}
		}
		return nil
	}
	slices.SortFunc(ms, func(a, b member) int { return compareFolded(a.name, b.name) })
	for i := 1; i < len(ms); i++ {
		if compareFolded(ms[i-1].name, ms[i].name) == 0 {
			return duplicateNames(ms[i-1].name, ms[i].name)
		}
	}
	return nil
}

func duplicateNames(a, b []byte) error {
	if bytes.Equal(a, b) {
		return fmt.Errorf("duplicate member name %q", a)
	}
	return fmt.Errorf("member names %q and %q are equal ignoring case, and encoding/json would not tell them apart", a, b)
}

// compareFolded orders names by their runes' simple case folds, so that it
// returns 0 exactly when bytes.EqualFold reports true.
func compareFolded(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if fa, fb := foldRune(ra), foldRune(rb); fa != fb {
			return cmp.Compare(fa, fb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// foldRune returns the smallest rune of r's simple case-folding orbit, the
// runes unicode.SimpleFold cycles through from r.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// compareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 requires. That is code point order except that U+10000 and
// above (surrogates D800–DBFF first) sort before U+E000–U+FFFF.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return cmp.Compare(len(a), len(b))
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return cmp.Compare(a[i], b[i])
	}
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return cmp.Compare(utf16Order(ra), utf16Order(rb))
}

func utf16Order(r rune) rune {
	if 0xE000 <= r && r <= 0xFFFF {
		return r + 0x110000 // after every code point above U+FFFF
	}
	return r
}

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

// number reads the number at c.pos and writes it the way ECMAScript's
// Number.prototype.toString writes the double it names, which is what RFC
// 8785 prescribes, provided the number is exactly that double's value.
func (c *canonicaliser) number() error {
	in, start := c.in, c.pos
	i := start
	if in[i] == '-' {
		i++
	}
	var intPart, fracPart, expPart []byte
	switch {
	case i < len(in) && in[i] == '0':
		intPart, i = in[i:i+1], i+1
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		j := digitsEnd(in, i)
		intPart, i = in[i:j], j
	default:
		return c.badNumber(start, i)
	}
	if i < len(in) && in[i] == '.' {
		j := digitsEnd(in, i+1)
		if j == i+1 {
			return c.badNumber(start, j)
		}
		fracPart, i = in[i+1:j], j
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		e := i + 1
		if e < len(in) && (in[e] == '+' || in[e] == '-') {
			e++
		}
		j := digitsEnd(in, e)
		if j == e {
			return c.badNumber(start, j)
		}
		expPart, i = in[i+1:j], j
	}
	c.pos = i
	lit := in[start:i]
	// Integers of up to 15 digits are below 2^53, so exact, and written as
	// they are.
	if fracPart == nil && expPart == nil && len(intPart) <= 15 {
		if intPart[0] == '0' {
			c.out = append(c.out, '0') // -0 too
		} else {
			c.out = append(c.out, lit...)
		}
		return nil
	}
	return c.appendNumber(lit, intPart, fracPart, expPart)
}

func digitsEnd(in []byte, i int) int {
	for i < len(in) && '0' <= in[i] && in[i] <= '9' {
		i++
	}
	return i
}

// appendNumber checks that lit is exactly the double closest to it and
// writes that double. Both sides are compared as significant digits (no
// leading or trailing zeros) and the power of ten of the last one.
func (c *canonicaliser) appendNumber(lit, intPart, fracPart, expPart []byte) error {
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil && math.IsInf(f, 0) {
		return fmt.Errorf("number %s is outside the IEEE 754 double range", lit)
	}
	var digits [17]byte // a double never needs more
	n, zeros, tooLong := 0, 0, false
	for _, part := range [2][]byte{intPart, fracPart} {
		for _, d := range part {
			switch {
			case d == '0' && n == 0: // leading
			case d == '0':
				zeros++
			case n+zeros >= len(digits):
				tooLong = true
			default:
				for ; zeros > 0; zeros-- {
					digits[n] = '0'
					n++
				}
				digits[n] = d
				n++
			}
		}
	}
	if n == 0 && !tooLong {
		c.out = append(c.out, '0') // any zero, -0 included
		return nil
	}
	// The literal's value is digits[:n] × 10^exp.
	exp := zeros - len(fracPart)
	if len(expPart) > 0 {
		e, neg := 0, expPart[0] == '-'
		for _, d := range expPart {
			if '0' <= d && d <= '9' && e < 1<<40 {
				e = e*10 + int(d-'0')
			}
		}
		if neg {
			e = -e
		}
		exp += e
	}
	// The double's shortest form: d.ddde±x, or -d.ddde±x.
	var buf [32]byte
	short := strconv.AppendFloat(buf[:0], math.Abs(f), 'e', -1, 64)
	e := bytes.IndexByte(short, 'e')
	mant, x := short[:e], 0
	for _, d := range short[e+2:] {
		x = x*10 + int(d-'0')
	}
	if short[e+1] == '-' {
		x = -x
	}
	var sig [17]byte
	k := copy(sig[:], mant[:1])
	if len(mant) > 2 {
		k += copy(sig[1:], mant[2:])
	}
	if tooLong || f == 0 || !bytes.Equal(sig[:k], digits[:n]) || x-(k-1) != exp {
		return fmt.Errorf("number %s cannot be represented exactly as an IEEE 754 double; send it as a string", lit)
	}
	if f < 0 {
		c.out = append(c.out, '-')
	}
	c.appendES(sig[:k], x+1)
	return nil
}

// appendES writes digits × 10^(point-len(digits)) as ECMAScript's
// Number.prototype.toString does: plain up to 21 integer digits and down to
// 0.000001, else d.ddde±x.
func (c *canonicaliser) appendES(digits []byte, point int) {
	k := len(digits)
	switch {
	case k <= point && point <= 21:
		c.out = append(c.out, digits...)
		for range point - k {
			c.out = append(c.out, '0')
		}
	case 0 < point && point <= 21:
		c.out = append(c.out, digits[:point]...)
		c.out = append(c.out, '.')
		c.out = append(c.out, digits[point:]...)
	case -6 < point && point <= 0:
		c.out = append(c.out, '0', '.')
		for range -point {
			c.out = append(c.out, '0')
		}
		c.out = append(c.out, digits...)
	default:
		c.out = append(c.out, digits[0])
		if k > 1 {
			c.out = append(c.out, '.')
			c.out = append(c.out, digits[1:]...)
		}
		c.out = append(c.out, 'e')
		if point-1 >= 0 {
			c.out = append(c.out, '+')
		}
		c.out = strconv.AppendInt(c.out, int64(point-1), 10)
	}
}

func (c *canonicaliser) literal(word string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(word)) {
		return c.unexpected()
	}
	c.pos += len(word)
	c.out = append(c.out, word...)
	return nil
}

func (c *canonicaliser) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// peek returns the byte at c.pos, or 0 (never valid there) at the end.
func (c *canonicaliser) peek() byte {
	if c.pos == len(c.in) {
		return 0
	}
	return c.in[c.pos]
}

func (c *canonicaliser) unexpected() error {
	if c.pos >= len(c.in) {
		return errors.New("unexpected end of input")
	}
	if b := c.in[c.pos]; b < utf8.RuneSelf {
		return fmt.Errorf("invalid character %q at offset %d", b, c.pos)
	}
	return fmt.Errorf("invalid byte 0x%02x at offset %d", c.in[c.pos], c.pos)
}

func (c *canonicaliser) expected(what string) error {
	if c.pos == len(c.in) {
		return c.unexpected()
	}
	return fmt.Errorf("expected %s at offset %d, found %q", what, c.pos, c.in[c.pos])
}

func (c *canonicaliser) tooDeep() error {
	return fmt.Errorf("arrays and objects nested deeper than %d levels at offset %d", MaxJSONDepth, c.pos)
}

func (c *canonicaliser) badNumber(start, at int) error {
	if at == len(c.in) {
		c.pos = at
		return c.unexpected()
	}
	return fmt.Errorf("invalid number at offset %d: unexpected %q", start, c.in[at])
}
