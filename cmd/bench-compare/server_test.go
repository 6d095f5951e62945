package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A connection string's password never reaches bench-compare's output: not
// the WARNING line that names DATABASE_URL's server, nor the FAILED line of
// a connection that failed, whether the password is a URL's user:password,
// its ?password=, or a key=value string's. Not parallel: it sets
// DATABASE_URL.
func TestServerMessagesHideThePassword(t *testing.T) {
	const secret = "s3cret-word"
	for _, url := range []string{
		"host=127.0.0.1 port=1 user=ana password=" + secret + " dbname=x connect_timeout=5",
		"postgres://ana@127.0.0.1:1/x?password=" + secret + "&connect_timeout=5",
		"postgres://ana:" + secret + "@127.0.0.1:1/x?connect_timeout=5",
		"host=127.0.0.1 port=abc password=" + secret, // does not parse
	} {
		t.Setenv("DATABASE_URL", url)
		var out bytes.Buffer
		u, _, stop, err := openServer(context.Background(), &out, 4, false, "")
		require.NoError(t, err)
		stop()
		require.Contains(t, out.String(), "WARNING: DATABASE_URL is set")
		require.NotContains(t, out.String(), secret, url)

		_, err = createDatabase(context.Background(), u, false)
		require.Error(t, err, url)
		require.NotContains(t, err.Error(), secret, url)
	}
}
