package aphttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

func header(values ...string) http.Header {
	h := http.Header{}
	for _, v := range values {
		h.Add(aphttp.HeaderName, v)
	}
	return h
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		`abc`:                    "abc",
		`"abc"`:                  "abc",
		` "abc" `:                "abc",
		`"with space"`:           "with space",
		`"a\"b\\c"`:              `a"b\c`,
		`"a,b"`:                  "a,b",
		`ride-2026/11:22`:        "ride-2026/11:22",
		strings.Repeat("k", 255): strings.Repeat("k", 255),
	}
	for in, want := range good {
		got, err := aphttp.ParseKey(header(in))
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := aphttp.ParseKey(http.Header{})
	require.ErrorIs(t, err, aphttp.ErrMissingKey)
	for _, in := range []string{``, `""`, `"a" , "b"`, `a, b`, `"open`, `"x";p=1`, `"\x"`, `a"b`, "\x01", "a\x7fb",
		`"caf` + "\u00e9" + `"`} {
		_, err := aphttp.ParseKey(header(in))
		require.ErrorIs(t, err, aphttp.ErrInvalidKey, "%q", in)
	}
	_, err = aphttp.ParseKey(header("a", "b"))
	require.ErrorIs(t, err, aphttp.ErrInvalidKey)
}

// TestParseKeyLeavesLengthAndCharactersToTheRunner: a key that is well
// formed as a header value is the parser's to accept, however long and
// whatever its bytes; the Runner decides whether it is a valid key.
func TestParseKeyLeavesLengthAndCharactersToTheRunner(t *testing.T) {
	t.Parallel()
	for _, in := range []string{strings.Repeat("k", 256), `"` + strings.Repeat("k", 1000) + `"`, "caf\u00e9", "tab\there"} {
		got, err := aphttp.ParseKey(header(in))
		require.NoError(t, err, "%q", in)
		require.Equal(t, strings.Trim(in, `"`), got)
	}
}

// FuzzParseKey: the parser never panics; whatever it accepts is a
// non-empty key a header can carry; every printable ASCII key round-trips
// through its sf-string form, which names the same key as the bare form
// whenever the bare form is accepted.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{`abc`, `"abc"`, `"a\"b"`, `"a,b"`, `a,b`, `""`, `"x";y`, "\x00", `"\\"`, "caf\u00e9"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := aphttp.ParseKey(header(raw))
		if err == nil {
			require.NotEmpty(t, key)
			for i := 0; i < len(key); i++ {
				require.False(t, (key[i] < 0x20 && key[i] != '\t') || key[i] == 0x7f, "%q", key)
			}
			if printable(key) {
				back, err := aphttp.ParseKey(header(aphttp.FormatKey(key)))
				require.NoError(t, err)
				require.Equal(t, key, back, "the quoted form names the same key")
			}
		}
		// Any printable key round-trips quoted, whatever its length.
		if raw != "" && printable(raw) {
			back, err := aphttp.ParseKey(header(aphttp.FormatKey(raw)))
			require.NoError(t, err, "%q", raw)
			require.Equal(t, raw, back)
		}
	})
}

func printable(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0
}
