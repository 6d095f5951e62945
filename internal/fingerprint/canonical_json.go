package fingerprint

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
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
	var c canonicaliser
	var members [16]member
	c.members = members[:0]
	return c.canonical(doc)
}

// canonical is CanonicalJSON, writing the canonical form into c.out (reset
// first, its array reused when it has room) with c.members as scratch.
func (c *canonicaliser) canonical(doc []byte) ([]byte, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	// The output is about as long as the input, and reordering an object
	// uses the space after it as scratch: room for both, for the bodies of
	// most requests.
	if room := len(doc) + min(len(doc), 64<<10); cap(c.out) < room {
		c.out = make([]byte, 0, room)
	}
	c.in, c.pos, c.out, c.members = doc, 0, c.out[:0], c.members[:0]
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

// FoldName folds every rune of name to the least rune of its simple case
// folding orbit, the way encoding/json's lenient match equates names (and
// the canonicaliser's case-twin check does): "ſku" folds like "SKU". The
// Runner's input decoding folds field names with it.
func FoldName(name string) string {
	var b strings.Builder
	for _, r := range name {
		b.WriteRune(foldRune(r))
	}
	return b.String()
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
