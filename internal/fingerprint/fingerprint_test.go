package fingerprint_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/fingerprint"
)

func TestFingerprintIdentifiesTheRequest(t *testing.T) {
	t.Parallel()
	base, err := fingerprint.Of("POST", "/rides", []byte(`{"a":1}`))
	require.NoError(t, err)
	for _, other := range [][3]string{
		{"PUT", "/rides", `{"a":1}`},
		{"POST", "/ride", `{"a":1}`},
		{"POST", "/rides", `{"a":2}`},
		{"POST", "/rides", `{"a":"1"}`},
		{"POST", "/rides", ``},
		// Length-prefixing keeps parts from bleeding into each other.
		{"POST/", "rides", `{"a":1}`},
	} {
		fp, err := fingerprint.Of(other[0], other[1], []byte(other[2]))
		require.NoError(t, err)
		require.NotEqual(t, base, fp, "%v", other)
	}
}

// FuzzFingerprint builds a JSON document from the fuzzer's bytes, encodes it
// twice with different member orders and spacing, and checks the
// fingerprints agree; then changes one leaf value and checks they differ.
func FuzzFingerprint(f *testing.F) {
	for _, seed := range []string{"", "a", "abcdefgh", "\x00\x01\x02\x03\x04\x05", "zzzzzzzzzzzzzzzzzzzzzzzzzzz"} {
		f.Add([]byte(seed), uint64(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		g := &gen{data: data}
		doc := g.value(0)
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

		a := render(doc, rng, false)
		b := render(doc, rng, true)
		fa, err := fingerprint.Of("POST", "/x", []byte(a))
		require.NoError(t, err, a)
		fb, err := fingerprint.Of("POST", "/x", []byte(b))
		require.NoError(t, err, b)
		require.Equal(t, fa, fb, "reordering and re-spacing changed the fingerprint:\n%s\n%s", a, b)

		changed, ok := mutate(doc, int(seed%7))
		if !ok {
			return
		}
		c := render(changed, rng, true)
		fc, err := fingerprint.Of("POST", "/x", []byte(c))
		require.NoError(t, err, c)
		require.NotEqual(t, fa, fc, "a changed value kept the fingerprint:\n%s\n%s", a, c)
	})
}

// gen turns fuzz bytes into a JSON value tree.
type gen struct {
	data []byte
	pos  int
}

func (g *gen) next() byte {
	if g.pos >= len(g.data) {
		return 0
	}
	g.pos++
	return g.data[g.pos-1]
}

func (g *gen) value(depth int) any {
	switch k := g.next() % 6; {
	case k == 0 && depth < 4:
		obj := map[string]any{}
		for n := int(g.next() % 4); n > 0; n-- {
			if name := g.str(); !hasNameFold(obj, name) {
				obj[name] = g.value(depth + 1)
			}
		}
		return obj
	case k == 1 && depth < 4:
		arr := []any{}
		for n := int(g.next() % 4); n > 0; n-- {
			arr = append(arr, g.value(depth+1))
		}
		return arr
	case k == 2:
		return g.str()
	case k == 3:
		return float64(int8(g.next())) / 4 // exact in binary, so text forms vary safely
	case k == 4:
		return g.next()%2 == 0
	default:
		return nil
	}
}

// hasNameFold reports whether obj has a member name equal to name ignoring
// case, which CanonicalJSON refuses.
func hasNameFold(obj map[string]any, name string) bool {
	for k := range obj {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

func (g *gen) str() string {
	const alphabet = "abAB é😀\"\\\n\t/ﬁ"
	runes := []rune(alphabet)
	var b strings.Builder
	for n := int(g.next() % 5); n > 0; n-- {
		b.WriteRune(runes[int(g.next())%len(runes)])
	}
	return b.String()
}

// render writes v as JSON, shuffling members and adding whitespace and
// alternative number spellings when noisy.
func render(v any, rng *rand.Rand, noisy bool) string {
	ws := func() string {
		if !noisy {
			return ""
		}
		return []string{"", " ", "\n", "\t ", "\r\n  "}[rng.IntN(5)]
	}
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if noisy {
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		}
		parts := make([]string, len(keys))
		for i, k := range keys {
			kb, _ := json.Marshal(k)
			parts[i] = ws() + string(kb) + ws() + ":" + ws() + render(x[k], rng, noisy) + ws()
		}
		return "{" + strings.Join(parts, ",") + ws() + "}"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = ws() + render(e, rng, noisy) + ws()
		}
		return "[" + strings.Join(parts, ",") + "]"
	case float64:
		if noisy {
			switch rng.IntN(3) {
			case 0:
				return fmt.Sprintf("%e", x)
			case 1:
				return fmt.Sprintf("%.6f", x)
			}
		}
		return fmt.Sprint(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// mutate changes the first leaf it finds, walking in sorted order; ok is
// false when the document has no leaf to change.
func mutate(v any, which int) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if nv, ok := mutate(x[k], which); ok {
				out := map[string]any{}
				for kk, vv := range x {
					out[kk] = vv
				}
				out[k] = nv
				return out, true
			}
		}
		return nil, false
	case []any:
		for i := range x {
			if nv, ok := mutate(x[i], which); ok {
				out := append([]any(nil), x...)
				out[i] = nv
				return out, true
			}
		}
		return nil, false
	case string:
		return x + "!", true
	case float64:
		return x + 0.25, true
	case bool:
		return !x, true
	default:
		return []any{which}, true // null becomes something else
	}
}

func BenchmarkFingerprintOf(b *testing.B) {
	params := []byte(typicalBody)
	b.SetBytes(int64(len(params)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fingerprint.Of("POST", "/rides", params); err != nil {
			b.Fatal(err)
		}
	}
}

// Of reuses its canonical form's buffer from one request to the next: each
// fingerprint is still the hash of its own request's canonical form,
// whatever request the buffer held before (a longer one, one with more
// members, one refused halfway), and from many goroutines at once.
func TestOfReusesNothingOfTheRequestBefore(t *testing.T) {
	t.Parallel()
	docs := []string{
		`{"b":2,"a":1}`,
		strings.Repeat(" ", 40) + `{"z":[1,2,{"y":"` + strings.Repeat("é", 5000) + `","x":null}],"a":true}`,
		``,
		`  `,
		`{"a":1,"a":2}`, // refused
		`{"m17":0,"m16":0,"m15":0,"m14":0,"m13":0,"m12":0,"m11":0,"m10":0,"m9":0,"m8":0,"m7":0,"m6":0,"m5":0,"m4":0,"m3":0,"m2":0,"m1":0,"m0":0}`,
		`[1.50, "x"]`,
		`{"b":2,"a":1}`,
	}
	want := func(doc string) ([fingerprint.Size]byte, error) {
		canon, err := fingerprint.CanonicalJSON([]byte(doc))
		if err != nil {
			return [fingerprint.Size]byte{}, err
		}
		return fingerprint.HashParts("atomicphase-fingerprint-v1", "POST", "/p", string(canon)), nil
	}
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				doc := docs[(i+g)%len(docs)]
				got, err := fingerprint.Of("POST", "/p", []byte(doc))
				exp, expErr := want(doc)
				if expErr != nil {
					assert.Error(t, err, "%q", doc)
					continue
				}
				assert.NoError(t, err, "%q", doc)
				assert.Equal(t, exp, got, "%q", doc)
			}
		}()
	}
	for range 4 {
		<-done
	}
}
