package atomicphase

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
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

// The header policy of stored responses. A stored response is replayed to
// whoever sends its key, so a header that belongs to one client (a cookie,
// credentials) or to one connection (hop-by-hop headers) must not be
// stored unless the workflow says it is safe; and since a stored value is
// written back verbatim, it must be a value net/http would send as it is.

// hopByHop are headers that describe one connection, or that net/http
// computes for the response it writes: never stored.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Content-Length": true, "Date": true, "Idempotent-Replayed": true,
}

// perClient are headers that belong to the client a response was first
// written for: stored only when WorkflowOpts.ReplayHeaders names them.
var perClient = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Cookie": true, "Authorization": true,
	"Www-Authenticate": true, "Authentication-Info": true, "Clear-Site-Data": true,
}

// allowedHeaders checks WorkflowOpts.ReplayHeaders and returns the set.
func allowedHeaders(names []string) (map[string]bool, error) {
	if len(names) == 0 {
		return nil, nil
	}
	allowed := make(map[string]bool, len(names))
	var errs []error
	for _, n := range names {
		c := http.CanonicalHeaderKey(n)
		switch {
		case !validHeaderName(n):
			errs = append(errs, fmt.Errorf("WorkflowOpts.ReplayHeaders: %q is not a header name", n))
		case hopByHop[c]:
			errs = append(errs, fmt.Errorf("WorkflowOpts.ReplayHeaders: %s describes one connection (or net/http computes it) and is never stored", c))
		default:
			allowed[c] = true
		}
	}
	return allowed, errors.Join(errs...)
}

// checkStoredHeader reports the first header of a response that the policy
// refuses to store: a hop-by-hop or computed header, a per-client header
// the workflow does not allow, or a name or value net/http would not send
// as it is (control characters, CR or LF in a value).
func checkStoredHeader(h http.Header, allowed map[string]bool) error {
	for name, values := range h {
		c := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			return fmt.Errorf("response header %q is not a valid header name", name)
		case hopByHop[c]:
			return fmt.Errorf("response header %s describes one connection (or net/http computes it); it is never stored", c)
		case perClient[c] && !allowed[c]:
			return fmt.Errorf("response header %s belongs to one client, and a replay would hand it to whoever sends the key; "+
				"name it in WorkflowOpts.ReplayHeaders only if that is safe", c)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("response header %s has a value with control characters (CR, LF, NUL, …), which net/http would not send as stored", c)
			}
		}
	}
	return nil
}

// replayHeader drops from a stored header what the policy refuses (rows
// stored before the policy, or under another workflow's), so a replay never
// carries it.
func replayHeader(h http.Header, allowed map[string]bool) http.Header {
	for name := range h {
		c := http.CanonicalHeaderKey(name)
		if hopByHop[c] || (perClient[c] && !allowed[c]) || !validHeaderName(name) {
			delete(h, name)
			continue
		}
		vs := h[name][:0]
		for _, v := range h[name] {
			if validHeaderValue(v) {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			delete(h, name)
		} else {
			h[name] = vs
		}
	}
	return h
}

// validHeaderName reports an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue reports a field value without control characters
// other than horizontal tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
