package aphttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// HeaderName is the request header carrying the idempotency key.
const HeaderName = "Idempotency-Key"

// RetryHeaderName is the request header a client sets, to RetryHeaderValue
// (an RFC 8941 boolean, true), on a request it sent before: a retry. The
// Handler then has the Runner read the key first (atomicphase.Request's
// Retry), which makes a replay, what a retry most often meets, cost one
// primary-key read. It changes what a request costs, never its answer; a
// missing header, or any other value, leaves the request unmarked. The
// Client sets it on every attempt after its first.
const RetryHeaderName = "Idempotency-Retry"

// RetryHeaderValue is RetryHeaderName's value on a retry.
const RetryHeaderValue = "?1"

// IsRetry reports whether h marks its request as a retry: one
// RetryHeaderName line whose value is RetryHeaderValue, blanks around it
// and RFC 8941 parameters after it (";a=1") aside. Anything else, "?0"
// among it, leaves the request unmarked.
func IsRetry(h http.Header) bool {
	v := h.Values(RetryHeaderName)
	if len(v) != 1 {
		return false
	}
	item, _, _ := strings.Cut(strings.TrimSpace(v[0]), ";")
	return item == RetryHeaderValue
}

// Key errors. ParseKey wraps them with detail.
var (
	ErrMissingKey = errors.New("no Idempotency-Key header")
	ErrInvalidKey = errors.New("malformed Idempotency-Key header")
)

// ParseKey reads the Idempotency-Key header of h. It accepts the key as an
// RFC 8941 sf-string ("abc", as the IETF draft writes it, with \" and \\
// escapes) or as a bare token (abc, as Stripe clients send it): both forms
// of the same characters are the same key.
//
// ParseKey checks syntax only. No header at all is ErrMissingKey. An empty
// value (bare or ""), several header lines, a comma-separated list,
// parameters after the string, a bad escape or a character the form cannot
// carry (outside printable ASCII in a sf-string; a control character, a
// comma or a quote in a bare key) is ErrInvalidKey. Whether the key is
// short enough and made of printable ASCII is the Runner's to decide
// (Config.MaxKeyLength): Run answers atomicphase.ErrInvalidKey, which
// Middleware maps to the same 400 as ErrInvalidKey here.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(HeaderName)
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", fmt.Errorf("%w: it appears %d times; send one key", ErrInvalidKey, len(values))
	}
	v := strings.Trim(values[0], " \t") // optional whitespace around a field value
	var key string
	if strings.HasPrefix(v, `"`) {
		k, rest, err := parseSFString(v)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
		}
		if rest != "" {
			return "", fmt.Errorf("%w: unexpected %q after the quoted key (a list or parameters?)", ErrInvalidKey, rest)
		}
		key = k
	} else {
		if i := strings.IndexAny(v, `,"`); i >= 0 {
			return "", fmt.Errorf("%w: a bare key may not contain %q (a list?); quote it as an sf-string", ErrInvalidKey, v[i])
		}
		// RFC 9110 field values carry no control characters but HTAB.
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
				return "", fmt.Errorf("%w: control character 0x%02x is not allowed in a header value", ErrInvalidKey, c)
			}
		}
		key = v
	}
	if key == "" {
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string at the start of s and returns
// its value and what follows it.
func parseSFString(s string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", "", errors.New(`a backslash in a quoted key must escape " or \`)
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("character 0x%02x is not allowed in a quoted key", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("the quoted key has no closing quote")
}

// FormatKey writes key as an RFC 8941 sf-string, the form the IETF draft
// uses; ParseKey reads it back. An sf-string carries printable ASCII only,
// which every key the Runner accepts is.
func FormatKey(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}
