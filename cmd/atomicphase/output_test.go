package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTruncate(t *testing.T) {
	t.Parallel()
	require.Equal(t, "short", truncate("short", 5))
	require.Equal(t, "shor…", truncate("shorter", 5))
	require.Equal(t, "ééé…", truncate("ééééé", 4), "counts runes, not bytes")
}

func TestCell(t *testing.T) {
	t.Parallel()
	require.Equal(t, "-", cell(""))
	require.Equal(t, "user 42", cell("user 42"))
	require.Equal(t, `"a\tb"`, cell("a\tb"), "a tab would split the table's column")
	require.Equal(t, `"a\nb"`, cell("a\nb"))
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "a b c", oneLine("a\n  b\tc\n"))
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, "user_42", shellQuote("user_42"))
	require.Equal(t, "tenant:eu/7", shellQuote("tenant:eu/7"))
	require.Equal(t, "'user 42'", shellQuote("user 42"))
	require.Equal(t, `'it'\''s'`, shellQuote("it's"))
	require.Equal(t, "''", shellQuote(""))
	require.Equal(t, "'é'", shellQuote("é"))
}

func TestBodyText(t *testing.T) {
	t.Parallel()
	text, enc := bodyText([]byte(`{"ok":true}`))
	require.Equal(t, `{"ok":true}`, text)
	require.Equal(t, "text", enc)
	text, enc = bodyText([]byte{0xff, 0x00})
	require.Equal(t, "/wA=", text)
	require.Equal(t, "base64", enc)
}
