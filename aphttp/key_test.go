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
		got, err := aphttp.ParseKey(header(in), 255)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := aphttp.ParseKey(http.Header{}, 255)
	require.ErrorIs(t, err, aphttp.ErrMissingKey)
	for _, in := range []string{``, `""`, `"a" , "b"`, `a, b`, `"open`, `"x";p=1`, `"\x"`, `a"b`, "\x01", "caf\u00e9",
		strings.Repeat("k", 256)} {
		_, err := aphttp.ParseKey(header(in), 255)
		require.ErrorIs(t, err, aphttp.ErrInvalidKey, "%q", in)
	}
	_, err = aphttp.ParseKey(header("a", "b"), 255)
	require.ErrorIs(t, err, aphttp.ErrInvalidKey)
}

// FuzzParseKey: the parser never panics; whatever it accepts is a valid
// key; and every valid key round-trips through its sf-string form, which
// names the same key as the bare form whenever the bare form is accepted.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{`abc`, `"abc"`, `"a\"b"`, `"a,b"`, `a,b`, `""`, `"x";y`, "\x00", `"\\"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := aphttp.ParseKey(header(raw), 255)
		if err == nil {
			require.NotEmpty(t, key)
			require.LessOrEqual(t, len(key), 255)
			for i := 0; i < len(key); i++ {
				require.True(t, key[i] >= 0x20 && key[i] <= 0x7e, "%q", key)
			}
			back, err := aphttp.ParseKey(header(aphttp.FormatKey(key)), 255)
			require.NoError(t, err)
			require.Equal(t, key, back, "the quoted form names the same key")
		}
		// Any printable key of legal length round-trips quoted.
		if raw != "" && len(raw) <= 255 && strings.IndexFunc(raw, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0 {
			back, err := aphttp.ParseKey(header(aphttp.FormatKey(raw)), 255)
			require.NoError(t, err, "%q", raw)
			require.Equal(t, raw, back)
		}
	})
}
