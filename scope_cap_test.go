package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The per-scope cap holds under concurrency: sixty new keys of one scope
// sent at once, under a cap of three, leave at most three unfinished keys.
// (The count and the insert are serialised per scope; without that, many
// acquisitions counted the same keys and passed the cap together.)
func TestScopeCapHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	for round := range 5 {
		b := setup(t, &atomicphase.Config{MaxUnfinishedPerScope: 3})
		type st struct{}
		wf := atomicphase.MustWorkflow("capped", startEmpty[st], []atomicphase.Phase[st]{
			atomicphase.Local("p", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
				return atomicphase.Outcome{}, errors.New("down") // the key stays unfinished
			}),
		}, nil)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 60 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, _ = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "tenant", Key: fmt.Sprint("k", i), Method: "POST", Path: "/"})
			}()
		}
		close(start)
		wg.Wait()
		n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE scope = 'tenant' AND response_status IS NULL`)
		require.LessOrEqual(t, n, 3, "round %d: %d unfinished keys under a cap of 3", round, n)
		require.Positive(t, n)
	}
}
