package atomicphase

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

type spellItem struct {
	SKU string `json:"sku"`
}

type spellOrder struct {
	Quantity int                  `json:"quantity"`
	Items    []spellItem          `json:"items"`
	Notes    map[string]spellItem `json:"notes"`
	Item     *spellItem           `json:"item"`
}

// spelledExactly spares the decoding only when checkExactNames would find
// nothing; otherwise it says "look".
func TestSpelledExactly(t *testing.T) {
	order := reflect.TypeFor[spellOrder]()
	for doc, want := range map[string]bool{
		`{"quantity":2,"items":[{"sku":"a"}],"item":{"sku":"b"}}`: true,
		`{"quantity":2,"other":"x"}`:                              true, // unknown members are allowed
		`{"Quantity":2}`:                                          false,
		`{"quantity":2,"items":[{"SKU":"a"}]}`:                    false,
		`{"quantity":2,"note":"QUANTITY"}`:                        false, // a value that folds to a field: look closer
		`{"quantity":2,"items":[{"sku":"\u0061"}]}`:               false, // escapes
		`{"quantity":2,"items":[{"ſku":"a"}]}`:                    false, // not ASCII
		`{"quantity":"unterminated}`:                              false,
	} {
		require.Equal(t, want, spelledExactly([]byte(doc), order), doc)
	}

	// Two fields that spell one folding differently: no spelling is safe.
	type a struct {
		ID string `json:"id"`
	}
	type both struct {
		ID string `json:"ID"`
		A  a      `json:"a"`
	}
	require.False(t, spelledExactly([]byte(`{"a":{"ID":"x"}}`), reflect.TypeFor[both]()))
	require.False(t, spelledExactly([]byte(`{"a":{"id":"x"}}`), reflect.TypeFor[both]()))
}

// Over many documents made of field names in every case, spelledExactly
// never accepts one that checkExactNames refuses.
func TestSpelledExactlyAgreesWithTheCheck(t *testing.T) {
	order := reflect.TypeFor[spellOrder]()
	words := []string{"quantity", "Quantity", "QUANTITY", "items", "Items", "sku", "SKU", "Sku", "item", "notes", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return words[rng.IntN(len(words))] }
	accepted := 0
	for range 5000 {
		doc := fmt.Sprintf(`{%q:[{%q:%q}],%q:{%q:{%q:1}}}`, pick(), pick(), pick(), pick(), pick(), pick())
		var v any
		require.NoError(t, json.Unmarshal([]byte(doc), &v))
		if spelledExactly([]byte(doc), order) {
			accepted++
			require.NoError(t, checkExactNames(v, order, ""), doc)
		}
	}
	require.Greater(t, accepted, 100, "documents take the fast path")
}
