package aphttp_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

// Only one header line holding an RFC 8941 true marks a retry; anything
// else leaves the request unmarked (which changes its cost, never its
// answer).
func TestIsRetryReadsOneTrueBoolean(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lines []string
		want  bool
	}{
		{[]string{"?1"}, true},
		{[]string{" ?1 "}, true},
		{[]string{"?1;a=1"}, true},
		{nil, false},
		{[]string{""}, false},
		{[]string{"?0"}, false},
		{[]string{"?0;a=1"}, false},
		{[]string{"true"}, false},
		{[]string{"1"}, false},
		{[]string{"?1", "?1"}, false},
		{[]string{"?1, ?1"}, false},
		{[]string{"?10"}, false},
	} {
		h := http.Header{}
		for _, l := range tc.lines {
			h.Add(aphttp.RetryHeaderName, l)
		}
		require.Equal(t, tc.want, aphttp.IsRetry(h), "%q", tc.lines)
	}
}
