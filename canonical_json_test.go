package atomicphase_test

import (
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
