package fingerprint

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A canonicaliser goes back to Of's pool holding nothing of the request it
// read, and no large scratch: a request with many members (here refused,
// after every member was read) would otherwise leave its scratch for every
// later request to clear.
func TestReleaseKeepsNothingOfTheRequest(t *testing.T) {
	var big strings.Builder
	big.WriteString(`{`)
	for i := range 2000 {
		fmt.Fprintf(&big, `"m%d":0,`, i)
	}
	big.WriteString(`"end":0} trailing`)
	c := &canonicaliser{}
	_, err := c.canonical([]byte(big.String()))
	require.Error(t, err)
	require.Greater(t, cap(c.members), maxKeptMembers)
	release(c)
	require.Zero(t, cap(c.members), "the large member scratch is dropped")
	require.Nil(t, c.in)

	c = canonicalisers.Get().(*canonicaliser)
	canon, err := c.canonical([]byte(`{"b":"secret","a":1}`))
	require.NoError(t, err)
	require.Equal(t, `{"a":1,"b":"secret"}`, string(canon))
	out := c.out
	release(c)
	require.Empty(t, c.out)
	require.NotContains(t, string(out[:cap(out)]), "secret", "the canonical form is cleared")
	for _, m := range c.members[:cap(c.members)] {
		require.Nil(t, m.name)
	}
}
