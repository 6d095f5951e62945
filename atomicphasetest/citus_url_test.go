package atomicphasetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Citus URL's password reaches no error of the harness: not the
// parse's, nor that of a coordinator that does not answer, whether the
// password is the URL's user:password or its ?password=.
func TestCitusURLErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-word"
	for _, url := range []string{
		"postgres://ana@127.0.0.1:1/x?password=" + secret + "&connect_timeout=5",
		"postgres://ana:" + secret + "@127.0.0.1:1/x?connect_timeout=5",
		"postgres://ana:" + secret + "@127.0.0.1:abc/x",
	} {
		_, err := connectCitus(context.Background(), url)
		require.Error(t, err, url)
		require.NotContains(t, err.Error(), secret, url)
	}
}
