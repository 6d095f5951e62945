package safetext_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/safetext"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	require.Equal(t, `a\x1b]0;pwned\x07b`, safetext.Escape("a\x1b]0;pwned\x07b"))
	require.Equal(t, "line 1\n\tline 2", safetext.Escape("line 1\n\tline 2"))
	require.Equal(t, `over\x0dwrite \x7f \u009b \u2028 \xff`, safetext.Escape("over\rwrite \x7f \u009b \u2028 \xff"))
	require.Equal(t, "ünïcode ok", safetext.Escape("ünïcode ok"))
}
