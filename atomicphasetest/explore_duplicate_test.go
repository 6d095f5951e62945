package atomicphasetest_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

// TestExploreConcurrentDuplicateAtEveryPoint: the same request sent a
// second time while the first stands at each point of each attempt — the
// shop's one attempt, and the payout's two when the bank's first answer is
// lost — still makes one effect, and the duplicate gets the final answer or
// 409 in progress.
func TestExploreConcurrentDuplicateAtEveryPoint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		sc   atomicphasetest.Scenario
	}{
		{"shop", shopScenario(testshop.Sound)},
		{"shop assuming new keys", shopScenario(testshop.AssumingNew)},
		{"payout answer lost", payoutScenario(testshop.BankActThenLose, true)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if testing.Verbose() {
				c.sc.Out = os.Stdout
			}
			rep := atomicphasetest.ExploreDuplicates(t, c.sc)
			points := 0
			for _, passed := range rep.Attempts {
				points += len(uniq(passed))
			}
			require.Len(t, rep.Rows, 1+points, "one run per attempt × point")
			for _, row := range rep.Rows[1:] {
				require.Equal(t, atomicphasetest.Duplicate, row.Faults[0].Action)
				require.Empty(t, row.Unfired, "the duplicate was sent at %v", row.Faults[0])
				require.Equal(t, "201", row.Outcome)
			}
		})
	}
}
