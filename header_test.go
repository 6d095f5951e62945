package atomicphase

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeHeader answers exactly what encoding/json does, for the plain
// form it parses by hand and for everything it hands over.
func TestDecodeHeaderMatchesEncodingJSON(t *testing.T) {
	for _, text := range []string{
		`{}`, ` { } `, `{"Location": ["/orders/1"]}`, `{"A":["1","2"],"B":[]}`,
		`{"Set-Cookie": ["a=1", "b=2"], "X-Ünïcode": ["ça va"]}`,
		`{"A": ["x\"y"]}`, `{"A": ["\u003cb\u003e"]}`, `{"A": null}`, `null`,
		`{"A": ["1"], "A": ["2"]}`, `{"A": ["1"],}`, `{"A": ["1"]} x`, `{"A": "1"}`, `{"A": [1]}`, `[`, `{"A`,
	} {
		var want http.Header
		wantErr := json.Unmarshal([]byte(text), &want)
		got, err := decodeHeader([]byte(text))
		if wantErr != nil {
			require.Error(t, err, text)
			continue
		}
		require.NoError(t, err, text)
		require.Equal(t, want, got, text)
	}
	h, err := decodeHeader(nil)
	require.NoError(t, err)
	require.Nil(t, h)
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add([]byte(`{"Location": ["/orders/1"], "B": []}`))
	f.Fuzz(func(t *testing.T, text []byte) {
		if len(text) == 0 {
			return
		}
		var want http.Header
		wantErr := json.Unmarshal(text, &want)
		got, err := decodeHeader(text)
		if (wantErr == nil) != (err == nil) {
			t.Fatalf("%q: encoding/json says %v, decodeHeader %v", text, wantErr, err)
		}
		if err == nil {
			require.Equal(t, want, got, "%q", text)
		}
	})
}

func BenchmarkDecodeHeader(b *testing.B) {
	text := []byte(`{"Location": ["/orders/1"], "Content-Type": ["application/json"]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeHeader(text); err != nil {
			b.Fatal(err)
		}
	}
}
