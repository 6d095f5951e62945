package atomicphase

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"
)

// decodeHeader decodes a stored response header: JSON text of an
// http.Header, as checkpointArgs writes it (nil for none). Replays decode
// one on every request, so the common form (names and values without
// escapes) is parsed by hand into one string and one slice shared by every
// value; anything else goes through encoding/json.
func decodeHeader(text []byte) (http.Header, error) {
	if len(text) == 0 {
		return nil, nil
	}
	if utf8.Valid(text) {
		if h, ok := decodePlainHeader(text); ok {
			return h, nil
		}
	}
	var h http.Header
	err := json.Unmarshal(text, &h)
	return h, err
}

// decodePlainHeader parses valid UTF-8 {"Name": ["value", ...], ...} whose
// strings hold no escapes, and reports false for anything else.
func decodePlainHeader(text []byte) (http.Header, bool) {
	// One pass to count the values and check the form; a second to cut.
	names, values, ok := scanPlainHeader(text, nil, nil)
	if !ok {
		return nil, false
	}
	s := string(text) // every name and value is cut from this one string
	h := make(http.Header, names)
	all := make([]string, 0, values)
	_, _, ok = scanPlainHeader(text, func(name [2]int, first, n int) {
		h[s[name[0]:name[1]]] = all[first : first+n : first+n]
	}, func(v [2]int) {
		all = append(all, s[v[0]:v[1]])
	})
	return h, ok
}

// scanPlainHeader walks a plain header document. For each value it calls
// value with the value's bounds in text, and after each name's values it
// calls add with the name's bounds and the index and count of its values.
// It returns the number of names and values.
func scanPlainHeader(text []byte, add func(name [2]int, first, n int), value func([2]int)) (names, values int, ok bool) {
	i := 0
	space := func() {
		for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
			i++
		}
	}
	str := func() (int, int, bool) {
		if i >= len(text) || text[i] != '"' {
			return 0, 0, false
		}
		start := i + 1
		for j := start; j < len(text); j++ {
			switch c := text[j]; {
			case c == '"':
				i = j + 1
				return start, j, true
			case c == '\\' || c < 0x20:
				return 0, 0, false
			}
		}
		return 0, 0, false
	}
	expect := func(c byte) bool {
		space()
		if i < len(text) && text[i] == c {
			i++
			return true
		}
		return false
	}
	if !expect('{') {
		return 0, 0, false
	}
	space()
	if i < len(text) && text[i] == '}' {
		i++
		space()
		return 0, 0, i == len(text)
	}
	for {
		space()
		ns, ne, ok := str()
		if !ok || !expect(':') || !expect('[') {
			return 0, 0, false
		}
		first := values
		space()
		if i < len(text) && text[i] == ']' {
			i++
		} else {
			for {
				space()
				vs, ve, ok := str()
				if !ok {
					return 0, 0, false
				}
				if value != nil {
					value([2]int{vs, ve})
				}
				values++
				if expect(']') {
					break
				}
				if !expect(',') {
					return 0, 0, false
				}
			}
		}
		if add != nil {
			add([2]int{ns, ne}, first, values-first)
		}
		names++
		if expect('}') {
			space()
			return names, values, i == len(text)
		}
		if !expect(',') {
			return 0, 0, false
		}
	}
}
