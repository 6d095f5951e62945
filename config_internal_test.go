package atomicphase

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A large Config.PhaseRetries must not overflow the backoff into a
// negative (or zero) ceiling, which would turn the retries into a hot loop.
func TestRetryBackoffDoesNotOverflow(t *testing.T) {
	t.Parallel()
	c := &Config{RetryBackoff: 10 * time.Millisecond}
	prev := time.Duration(0)
	for try := 0; try < 200; try++ {
		d := c.retryBackoff(try)
		require.Positive(t, d, "try %d", try)
		require.GreaterOrEqual(t, d, prev, "try %d", try)
		prev = d
	}
}
