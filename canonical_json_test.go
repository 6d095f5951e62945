package atomicphase_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{``, ``},
		{`  `, ``},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n \"a\" : [ 1 , 2 ] } ", `{"a":[1,2]}`},
		{`[1.0, 1e0, 10e-1, -0, 0.000001, 1e-7, 1e21, 123456789012345678901, 1.5e300]`,
			`[1,1,1,0,0.000001,1e-7,1e+21,123456789012345680000,1.5e+300]`},
		{`"\u00e9\u0001\n\/"`, "\"é\\u0001\\n/\""},
		// RFC 8785 orders by UTF-16 code units: U+1F600 (surrogates D83D…)
		// sorts before U+FB01 although its UTF-8 bytes sort after.
		{`{"\ufb01":1,"😀":2,"a":3}`, `{"a":3,"😀":2,"ﬁ":1}`},
		{`{"nested":{"z":null,"y":true,"x":false}}`, `{"nested":{"x":false,"y":true,"z":null}}`},
	}
	for _, c := range cases {
		got, err := atomicphase.CanonicalJSON([]byte(c.in))
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, string(got), c.in)
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{"a":1,"a":2}`, `{"a":`, `[1,]`, `1 2`, `1e400`, "\"\xff\"", `{"a" 1}`} {
		_, err := atomicphase.CanonicalJSON([]byte(in))
		require.Error(t, err, in)
	}
}

// TestCanonicalJSONVectors checks the RFC 8785 reference implementation's
// test vectors (testdata/json-canonicalization): each input canonicalises
// to its output byte for byte.
func TestCanonicalJSONVectors(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/json-canonicalization/input/*.json")
	require.NoError(t, err)
	require.Len(t, inputs, 6)
	for _, in := range inputs {
		doc, err := os.ReadFile(in)
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join("testdata/json-canonicalization/output", filepath.Base(in)))
		require.NoError(t, err)
		got, err := atomicphase.CanonicalJSON(doc)
		require.NoError(t, err, in)
		require.Equal(t, string(want), string(got), in)
	}
}

// typicalBody is a request body of the size and shape an API receives
// most: about 200 bytes, compact, members in the client's struct order.
const typicalBody = `{"amount":2000,"currency":"usd","customer":"cus_9s6XKzkNRiz8i3",` +
	`"description":"Ride 4521 from Mission Bay to SoMa","capture":true,` +
	`"metadata":{"rider":"r_8812","order_id":"6735"},"tip_rate":0.15,"seats":[1,2]}`

func BenchmarkCanonicalJSON(b *testing.B) {
	doc := []byte(typicalBody)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := atomicphase.CanonicalJSON(doc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalJSONDeep feeds documents nested far too deep, the
// shape of a body meant to exhaust the server: complete ones (every bracket
// closed) and ones that only open.
func BenchmarkCanonicalJSONDeep(b *testing.B) {
	nested := func(open, leaf, close string, depth int) []byte {
		return []byte(strings.Repeat(open, depth) + leaf + strings.Repeat(close, depth))
	}
	for _, c := range []struct {
		name string
		doc  []byte
	}{
		{"arrays_200000", nested("[", "", "]", 200_000)},
		{"objects_10000", nested(`{"a":`, "0", "}", 10_000)},
		{"objects_30000", nested(`{"a":`, "0", "}", 30_000)},
		{"objects_100000", nested(`{"a":`, "0", "}", 100_000)},
		{"open_arrays_200000", bytes.Repeat([]byte("["), 200_000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.doc)))
			b.ReportAllocs()
			for b.Loop() {
				atomicphase.CanonicalJSON(c.doc) //nolint:errcheck // only the time matters
			}
		})
	}
}
