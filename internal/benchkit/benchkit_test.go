package benchkit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

func TestChargeIsIdempotentAtTheAPI(t *testing.T) {
	t.Parallel()
	fake, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	p := NewPayments(fake.URL, 4)
	id, err := p.Charge(context.Background(), "cus_1", "k1", "ride", 2000, "usd")
	require.NoError(t, err)
	again, err := p.Charge(context.Background(), "cus_1", "k1", "ride", 2000, "usd")
	require.NoError(t, err)
	require.Equal(t, id, again, "the same key answers the same charge")
	charges := fake.Charges()
	require.Len(t, charges, 1)
	require.Equal(t, int64(2000), charges[0].Amount)
	require.Equal(t, "cus_1", charges[0].Customer)
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	s := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(5), Percentile(s, 0.5))
	require.Equal(t, time.Duration(10), Percentile(s, 0.99))
	require.Equal(t, time.Duration(1), Percentile(s, 0))
	require.Equal(t, time.Duration(7), Percentile([]time.Duration{7}, 0.99))
}
