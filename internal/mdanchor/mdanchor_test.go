package mdanchor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAnchors(t *testing.T) {
	got := Anchors("# Running it\n## The sweep, and reapers (with several)\n```sh\n# not a heading\n```\n## The sweep, and reapers (with several)\n#hashtag\n### a_b-c")
	require.Equal(t, map[string]bool{"running-it": true, "the-sweep-and-reapers-with-several": true,
		"the-sweep-and-reapers-with-several-1": true, "a_b-c": true}, got)
}
