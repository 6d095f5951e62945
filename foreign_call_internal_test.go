package atomicphase

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDownstreamKeyPartsAllCount(t *testing.T) {
	t.Parallel()
	base := downstreamKey("salt", "order", "user_1", "k", "charge")
	require.Equal(t, base, downstreamKey("salt", "order", "user_1", "k", "charge"), "stable")
	for name, other := range map[string]string{
		"phase":    downstreamKey("salt", "order", "user_1", "k", "refund"),
		"scope":    downstreamKey("salt", "order", "user_2", "k", "charge"),
		"key":      downstreamKey("salt", "order", "user_1", "k2", "charge"),
		"workflow": downstreamKey("salt", "refund", "user_1", "k", "charge"),
		"salt":     downstreamKey("pepper", "order", "user_1", "k", "charge"),
		"no salt":  downstreamKey("", "order", "user_1", "k", "charge"),
		"concat":   downstreamKey("salt", "order", "user_1k", "", "charge"),
	} {
		require.NotEqual(t, base, other, name)
	}
	// Rows recorded before the salt existed keep the keys they sent.
	require.Equal(t, "ap_", downstreamKey("", "order", "user_1", "k", "charge")[:3])
}

// Rows recorded before migration 003 have no salt; they must keep sending
// the downstream keys the code before it derived, or an interrupted call
// would be repeated under a new key after the upgrade. The value is what
// that code computed for this tuple.
func TestUnsaltedDownstreamKeyIsTheOldDerivation(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ap_559e71eac64ceb2611064da371e3eb91c242f2ee", downstreamKey("", "order", "user_1", "k", "charge"))
}
