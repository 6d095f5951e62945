package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/fingerprint"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{``, ``},
		{`  `, ``},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n \"a\" : [ 1 , 2 ] } ", `{"a":[1,2]}`},
		{`[1.0, 1e0, 10e-1, -0, 0.000001, 1e-7, 1e21, 123456789012345680000, 1.5e300]`,
			`[1,1,1,0,0.000001,1e-7,1e+21,123456789012345680000,1.5e+300]`},
		{`"\u00e9\u0001\n\/"`, "\"é\\u0001\\n/\""},
		// RFC 8785 orders by UTF-16 code units: U+1F600 (surrogates D83D…)
		// sorts before U+FB01 although its UTF-8 bytes sort after.
		{`{"\ufb01":1,"😀":2,"a":3}`, `{"a":3,"😀":2,"ﬁ":1}`},
		{`{"nested":{"z":null,"y":true,"x":false}}`, `{"nested":{"x":false,"y":true,"z":null}}`},
		// U+10000 and above sort before U+E000–U+FFFF.
		{`{"\ue000":1,"\ud800\udc00":2,"\ud7ff":3}`, "{\"\ud7ff\":3,\"𐀀\":2,\"\ue000\":1}"},
		// Names are ordered by their decoded characters, not their escapes.
		{`{"b":1,"\u0061\"":2,"\n":3,"ab":4,"a":5}`, `{"\n":3,"a":5,"a\"":2,"ab":4,"b":1}`},
		{`[{"b":[{"d":1,"c":2}],"a":0},{"y":1,"x":{}}]`, `[{"a":0,"b":[{"c":2,"d":1}]},{"x":{},"y":1}]`},
		{"\t\r\n true \n", `true`},
		{`"\"\\\b\f\n\r\t\u001f\u007f\u2028\ud83d\ude00"`, "\"\\\"\\\\\\b\\f\\n\\r\\t\\u001f\u007f\u2028😀\""},
		{`[null,false,-1,0.5,"x",[],{}]`, `[null,false,-1,0.5,"x",[],{}]`},
	}
	for _, c := range cases {
		got, err := fingerprint.CanonicalJSON([]byte(c.in))
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, string(got), c.in)
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"a":1,"a":2}`, `{"a":`, `[1,]`, `1 2`, `1e400`, "\"\xff\"", `{"a" 1}`,
		`{`, `[`, `]`, `}`, `{,}`, `{"a":1,}`, `[1 2]`, `{"a"}`, `{1:2}`, `{"a":1}{"b":2}`, `[1]x`,
		`01`, `-01`, `1.`, `.5`, `+1`, `1e`, `1e+`, `-`, `--1`, `1.5.2`, `NaN`, `Infinity`,
		`tru`, `nul`, `falsey`, `'a'`,
		`"abc`, `"\`, `"\x"`, `"\u12"`, `"\u12G4"`, "\"a\tb\"", "\"\xc3\"", "\xc3\xa9",
		"\xef\xbb\xbf{}", "{}\x00", "\v{}",
	} {
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.Error(t, err, in)
	}
}

// TestCanonicalJSONDepth: nesting is limited, so a body of brackets can
// neither exhaust the stack nor take time that grows with the square of
// its depth; the limit is answered as soon as it is passed, at any size
// (8 MiB of "[" once overflowed the stack and killed the process;
// BenchmarkCanonicalJSONDeep times the answer).
func TestCanonicalJSONDepth(t *testing.T) {
	t.Parallel()
	nested := func(open, leaf, close string, depth int) []byte {
		return []byte(strings.Repeat(open, depth) + leaf + strings.Repeat(close, depth))
	}
	for _, doc := range [][]byte{
		nested("[", "", "]", fingerprint.MaxJSONDepth),
		nested(`{"a":`, "0", "}", fingerprint.MaxJSONDepth),
		nested(`[{"a":`, "0", "}]", fingerprint.MaxJSONDepth/2),
	} {
		got, err := fingerprint.CanonicalJSON(doc)
		require.NoError(t, err)
		require.Equal(t, string(doc), string(got))
	}
	for _, doc := range [][]byte{
		nested("[", "", "]", fingerprint.MaxJSONDepth+1),
		nested(`{"a":`, "0", "}", fingerprint.MaxJSONDepth+1),
		nested(`[{"a":`, "0", "}]", fingerprint.MaxJSONDepth/2+1),
		nested(`{"a":`, "0", "}", 200_000),
		bytes.Repeat([]byte("["), 8<<20),
		bytes.Repeat([]byte(`{"a":`), 8<<20/5),
	} {
		_, err := fingerprint.CanonicalJSON(doc)
		require.ErrorContains(t, err, fmt.Sprintf("nested deeper than %d levels", fingerprint.MaxJSONDepth))
	}
}

// TestCanonicalJSONNumbers: a number is accepted only when it equals the
// shortest form of the double closest to it, so two numbers the server
// tells apart (an int64 field, say) never share a fingerprint.
func TestCanonicalJSONNumbers(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`9007199254740992`:                `9007199254740992`,
		`-9007199254740992`:               `-9007199254740992`,
		`1.50`:                            `1.5`,
		`1.5e0`:                           `1.5`,
		`15e-1`:                           `1.5`,
		`0.15E+1`:                         `1.5`,
		`100`:                             `100`,
		`1e2`:                             `100`,
		`1.00e+2`:                         `100`,
		`-0`:                              `0`,
		`-0.0e-10`:                        `0`,
		`0e99999999999999999999`:          `0`,
		`0.1`:                             `0.1`,
		`0.000001`:                        `0.000001`,
		`1e-7`:                            `1e-7`,
		`1e21`:                            `1e+21`,
		`123456789012345680000`:           `123456789012345680000`,
		`1000000000000000000000000000000`: `1e+30`,
		`5e-324`:                          `5e-324`,
		`1.7976931348623157e308`:          `1.7976931348623157e+308`,
		`-2.2250738585072014E-308`:        `-2.2250738585072014e-308`,
		`333333333.3333333`:               `333333333.3333333`,
	} {
		got, err := fingerprint.CanonicalJSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
	for _, in := range []string{
		`9007199254740993`,
		`0.10000000000000000001`,
		`123456789012345678901`,
		`9223372036854775807`,
		`333333333.33333329`,
		`4.9e-324`,
		`1e-400`,
		`-1e-400`,
		`1.00000000000000000000000000000000000000000000000000000000000000000000001`,
	} {
		_, err := fingerprint.CanonicalJSON([]byte(`{"n":[` + in + `]}`))
		require.ErrorContains(t, err, "number "+in+" cannot be represented exactly as an IEEE 754 double; send it as a string")
	}
	for _, in := range []string{`1e400`, `-1e400`, `1.8e308`} {
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.ErrorContains(t, err, "outside the IEEE 754 double range", in)
	}
}

// FuzzCanonicalJSONNumber checks the number rule against math/big on
// numbers written with too few, just enough and too many digits: a number
// is accepted exactly when it equals, as a fraction, the shortest form of
// the double closest to it, and is then written as that double.
func FuzzCanonicalJSONNumber(f *testing.F) {
	for _, bits := range []uint64{
		0, 1 << 63, 1, 0x3fb999999999999a /* 0.1 */, 0x4340000000000001, /* 2^53+2 */
		0x7fefffffffffffff, 0x000fffffffffffff, 0x44b52d02c7e14af6, 0x3eb0c6f7a0b5ed8d,
	} {
		for _, prec := range []int8{-1, 0, 5, 15, 16, 17, 20} {
			f.Add(bits, prec, byte(0))
			f.Add(bits, prec, byte(2))
		}
	}
	f.Fuzz(func(t *testing.T, bits uint64, prec int8, style byte) {
		x := math.Float64frombits(bits)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		lit := strconv.FormatFloat(x, "egf"[style%3], int(prec%30), 64)
		value, ok := new(big.Rat).SetString(lit)
		require.True(t, ok, lit)
		canon, err := fingerprint.CanonicalJSON([]byte(lit))
		closest, rangeErr := strconv.ParseFloat(lit, 64)
		if math.IsInf(closest, 0) { // the largest double rounded up
			require.Error(t, rangeErr, lit)
			require.ErrorContains(t, err, "outside the IEEE 754 double range", lit)
			return
		}
		shortest, ok := new(big.Rat).SetString(strconv.FormatFloat(closest, 'g', -1, 64))
		require.True(t, ok, lit)
		if value.Cmp(shortest) != 0 {
			require.ErrorContains(t, err, "cannot be represented exactly", lit)
			return
		}
		require.NoError(t, err, lit)
		back, err := strconv.ParseFloat(string(canon), 64)
		require.NoError(t, err, "%s canonicalised to %s", lit, canon)
		require.Equal(t, closest, back, "%s canonicalised to %s", lit, canon)
	})
}

// TestCanonicalJSONCaseInsensitiveDuplicates: encoding/json matches member
// names to fields ignoring case, so an object whose names are equal under
// simple case folding would decode to a value its fingerprint does not
// pin down; it is rejected at any depth.
func TestCanonicalJSONCaseInsensitiveDuplicates(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"quantity":1,"Quantity":2}`,
		`{"Quantity":2,"quantity":1}`,
		`{"a":{"b":{"x":1,"y":2,"X":3}}}`,
		`[1,[{"k":1,"K":2}]]`,
		`{"a":1,"a":2}`,
		`{"a":{"x":1,"x":1}}`,
		`{"\u0041":1,"a":2}`,
	} {
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.ErrorContains(t, err, "member name", in)
	}
	// Agree with strings.EqualFold, the rule encoding/json decodes by, on
	// pairs where Unicode case folding is subtle.
	for _, pair := range [][2]string{
		{`k`, `\u212a`},      // KELVIN SIGN folds to k
		{`s`, `\u017f`},      // LATIN SMALL LETTER LONG S folds to s
		{`\u00df`, `\u1e9e`}, // sharp s and capital sharp s
		{`\u03c3`, `\u03c2`}, // sigma and final sigma
		{`\u03a3`, `\u03c2`},
		{`\u00e9`, `\u00c9`},
		{`e`, `\u00e9`},
		{`\ufb01`, `fi`}, // full folding only: not equal
		{`ss`, `\u00df`},
		{`\ud801\udc00`, `\ud801\udc28`}, // DESERET capital and small long i
		{`ab`, `abc`},
		{`a`, `b`},
	} {
		doc := `{"` + pair[0] + `":1,"` + pair[1] + `":2}`
		var names [2]string
		for i, n := range pair {
			require.NoError(t, json.Unmarshal([]byte(`"`+n+`"`), &names[i]))
		}
		_, err := fingerprint.CanonicalJSON([]byte(doc))
		if strings.EqualFold(names[0], names[1]) {
			require.ErrorContains(t, err, "member name", doc)
		} else {
			require.NoError(t, err, doc)
		}
	}
	// Many members, where duplicates are not found pairwise.
	var members []string
	for i := range 40 {
		members = append(members, fmt.Sprintf(`"m%02d":%d`, 39-i, i))
	}
	many := "{" + strings.Join(members, ",")
	got, err := fingerprint.CanonicalJSON([]byte(many + "}"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(got), `{"m00":39,"m01":38,`), string(got))
	for _, dup := range []string{`"M17":0`, `"m17":0`, `"k":0,"\u212a":1`} {
		_, err = fingerprint.CanonicalJSON([]byte(many + "," + dup + "}"))
		require.ErrorContains(t, err, "member name", dup)
	}
}

// TestCanonicalJSONStringsRejectNULAndLoneSurrogates: PostgreSQL text
// cannot hold U+0000, and a lone surrogate is no character (encoding/json
// would quietly read U+FFFD, so "\ud800" and "\ufffd" would share a
// decoded value and not a fingerprint).
func TestCanonicalJSONStringsRejectNULAndLoneSurrogates(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`"\u0000"`,
		`["a\u0000b"]`,
		`{"\u0000":1}`,
		`{"a":{"b\u0000":1}}`,
	} {
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.ErrorContains(t, err, "U+0000", in)
	}
	for _, in := range []string{
		`"\ud800"`,
		`"\udc00"`,
		`"\uDBFF"`,
		`"x\ud800y"`,
		`"\ud800\u0041"`,
		`"\ud800\ud800"`,
		`"\udc00\ud800"`,
		`"\ud800\n"`,
		`{"\udfff":1}`,
		`{"a":["\ud83d"]}`,
	} {
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.ErrorContains(t, err, "surrogate", in)
	}
	for _, in := range []string{"\"\x00\"", "\"\xed\xa0\x80\""} { // raw NUL; a surrogate in UTF-8
		_, err := fingerprint.CanonicalJSON([]byte(in))
		require.Error(t, err, in)
	}
	for in, want := range map[string]string{
		`"\ud83d\ude00"`: `"😀"`,
		`"\uD83D\uDE00"`: `"😀"`,
		`"\u0001\u001F"`: `"\u0001\u001f"`,
		`"\ufffd"`:       "\"\ufffd\"",
	} {
		got, err := fingerprint.CanonicalJSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
}

// TestCanonicalJSONVectors checks the RFC 8785 reference implementation's
// test vectors (testdata/json-canonicalization): each input canonicalises
// to its output byte for byte, except two that hold what CanonicalJSON
// refuses on purpose. Those are checked refused, then checked byte for byte
// with the offending detail changed in input and output alike.
func TestCanonicalJSONVectors(t *testing.T) {
	t.Parallel()
	refused := map[string]struct {
		why     string
		in, out *strings.Replacer
	}{
		// 333333333.33333329 names the double 333333333.3333333.
		"values.json": {
			why: "number 333333333.33333329 cannot be represented exactly",
			in:  strings.NewReplacer("333333333.33333329", "333333333.3333333"),
			out: strings.NewReplacer(),
		},
		// "f" and "F", "e" and "E", "a" and "A" are members of one object.
		"structures.json": {
			why: "are equal ignoring case",
			in:  strings.NewReplacer(`"F"`, `"G"`, `"E"`, `"D"`, `"A"`, `"B"`),
			out: strings.NewReplacer(`"F"`, `"G"`, `"E"`, `"D"`, `"A"`, `"B"`),
		},
	}
	inputs, err := filepath.Glob("testdata/json-canonicalization/input/*.json")
	require.NoError(t, err)
	require.Len(t, inputs, 6)
	for _, in := range inputs {
		doc, err := os.ReadFile(in)
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join("testdata/json-canonicalization/output", filepath.Base(in)))
		require.NoError(t, err)
		got, err := fingerprint.CanonicalJSON(doc)
		if r, ok := refused[filepath.Base(in)]; ok {
			require.ErrorContains(t, err, r.why, in)
			edited := r.in.Replace(string(doc))
			require.NotEqual(t, string(doc), edited)
			doc, want = []byte(edited), []byte(r.out.Replace(string(want)))
			got, err = fingerprint.CanonicalJSON(doc)
		}
		require.NoError(t, err, in)
		require.Equal(t, string(want), string(got), in)
	}
}

// FuzzCanonicalJSON compares CanonicalJSON with encoding/json on arbitrary
// bytes. A document it accepts is JSON that encoding/json reads as the same
// value as the canonical form, and the canonical form is its own canonical
// form; valid JSON it refuses breaks one of the documented rules.
func FuzzCanonicalJSON(f *testing.F) {
	inputs, err := filepath.Glob("testdata/json-canonicalization/input/*.json")
	require.NoError(f, err)
	for _, in := range inputs {
		doc, err := os.ReadFile(in)
		require.NoError(f, err)
		f.Add(doc)
	}
	for _, seed := range []string{
		typicalBody, ``, ` `, `[]`, `{}`, `0`, `-0`, `1.5e300`, `9007199254740993`, `0.1`, `1e-400`,
		`{"a":1,"A":2}`, `{"k":1,"\u212a":2}`, `"\u0000"`, `"\ud800"`, `"\ud83d\ude00"`, `[[[[[[]]]]]]`,
		`{"\"":"\\","\n":[true,false,null]}`, "\"\xff\"", `{"a":[1,2,{"b":"c"}]}`,
	} {
		f.Add([]byte(seed))
	}
	rules := []string{
		"nested deeper than", "cannot be represented exactly", "outside the IEEE 754 double range",
		"member name", "U+0000", "unpaired surrogate", "invalid UTF-8",
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := fingerprint.CanonicalJSON(doc)
		if err != nil {
			if json.Valid(doc) {
				require.Condition(t, func() bool {
					for _, r := range rules {
						if strings.Contains(err.Error(), r) {
							return true
						}
					}
					return false
				}, "valid JSON %q refused for no documented rule: %v", doc, err)
			}
			return
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			require.Empty(t, canon)
			return
		}
		require.True(t, json.Valid(doc), "%q accepted", doc)
		again, err := fingerprint.CanonicalJSON(canon)
		require.NoError(t, err, "%q", canon)
		require.Equal(t, string(canon), string(again))
		var want, got any
		require.NoError(t, json.Unmarshal(doc, &want))
		require.NoError(t, json.Unmarshal(canon, &got))
		require.Equal(t, want, got, "%q canonicalised to %q", doc, canon)
	})
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
		if _, err := fingerprint.CanonicalJSON(doc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalJSONLarge canonicalises a 1 MiB document: an array of
// typical bodies.
func BenchmarkCanonicalJSONLarge(b *testing.B) {
	doc := []byte("[" + strings.Repeat(typicalBody+",", 1<<20/(len(typicalBody)+1)) + "0]")
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fingerprint.CanonicalJSON(doc); err != nil {
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
		{"open_arrays_8MiB", bytes.Repeat([]byte("["), 8<<20)},
		// As deep as allowed, every object out of order: the most
		// reordering a document can ask for.
		{"objects_at_limit", nested(`{"b":[1,2,3],"a":`, "0", "}", fingerprint.MaxJSONDepth)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.doc)))
			b.ReportAllocs()
			for b.Loop() {
				fingerprint.CanonicalJSON(c.doc) //nolint:errcheck // only the time matters
			}
		})
	}
}
