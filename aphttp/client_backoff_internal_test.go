package aphttp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClientBackoffStaysInItsBounds: every retry's backoff lies between
// three quarters of its doubled MinBackoff, at most MaxBackoff, and that
// value, however many retries came before and however long MinBackoff is
// (its doubling would pass the largest time.Duration).
func TestClientBackoffStaysInItsBounds(t *testing.T) {
	t.Parallel()
	for _, bounds := range [][2]time.Duration{
		{time.Millisecond, 5 * time.Millisecond},
		{250 * time.Millisecond, 5 * time.Second},
		{time.Minute, 5 * time.Minute},
		{time.Hour, 24 * time.Hour},
		{time.Second, time.Second},
	} {
		c := NewClient(&ClientOptions{MinBackoff: bounds[0], MaxBackoff: bounds[1]})
		want := bounds[0]
		for n := 1; n <= 200; n++ {
			d := c.backoff(n)
			require.GreaterOrEqual(t, d, want-want/4, "retry %d of %v", n, bounds)
			require.LessOrEqual(t, d, want, "retry %d of %v", n, bounds)
			want = min(2*want, bounds[1])
		}
	}
}
