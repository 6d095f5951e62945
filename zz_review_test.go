package atomicphase_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A foreign phase (keyed downstream, no reconcile) whose own record step
// breaks a CHECK: the call went out, nothing of it is recorded, the key
// parks (paid refusal). It is not Unsettled, so Forget/ForgetKeys/ReapParked
// delete it and the client's retry charges again under a new downstream key.
func TestZZReviewPaidRefusalInRecordStepIsForgettable(t *testing.T) {
	for _, how := range []string{"forget", "bulk-forget", "reap", "later-phase-bulk-forget"} {
		t.Run(how, func(t *testing.T) {
			b := setupDB(t, shopDBOpts, nil)
			charges := map[string]int{}
			insert := func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO orders (scope, product_id, quantity) VALUES ('u', $1, $2)`, s.Product, s.Quantity); err != nil {
					return atomicphase.Outcome{}, fmt.Errorf("receipt: %w", err)
				}
				return atomicphase.Respond(201, []byte("ordered")), nil
			}
			call := func(ctx context.Context, call *atomicphase.ForeignCall, s *buyIn) error {
				return call.Do(ctx, func(ctx context.Context, key string) error { charges[key]++; return nil })
			}
			var phases []atomicphase.Phase[buyIn]
			if how == "later-phase-bulk-forget" {
				phases = []atomicphase.Phase[buyIn]{atomicphase.Foreign("charge", call, nil), atomicphase.Local("receipt", insert)}
			} else {
				phases = []atomicphase.Phase[buyIn]{atomicphase.Foreign("charge", call, insert)}
			}
			wf := atomicphase.MustWorkflow("zz-charge", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil }, phases, nil)
			req := buyRequest("order-1", 1, 0)
			_, err := b.runner.Run(b.ctx, wf, req)
			var pe *atomicphase.PhaseError
			require.ErrorAs(t, err, &pe)
			require.True(t, pe.Parked, "%v", err)
			require.Len(t, charges, 1)
			info, err := b.runner.Inspect(b.ctx, "u", "order-1")
			require.NoError(t, err)
			t.Logf("parked: rp=%s unsettled=%v unknown=%v callUntil=%v", info.RecoveryPoint, info.Unsettled, info.UnknownAt, info.CallUntil)
			switch how {
			case "forget":
				require.NoError(t, b.runner.Forget(b.ctx, "u", "order-1"))
			case "bulk-forget", "later-phase-bulk-forget":
				dry, err := b.runner.ForgetKeys(b.ctx, nil, &atomicphase.BulkOpts{DryRun: true})
				require.NoError(t, err)
				require.Len(t, dry, 1)
				t.Logf("dry run flags unsettled: %v", dry[0].Unsettled)
				got, err := b.runner.ForgetKeys(b.ctx, nil, nil)
				require.NoError(t, err)
				require.Len(t, got, 1)
			case "reap":
				n, err := b.runner.ReapParked(b.ctx, 0, 100)
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}
			// The client retries (same key, even with corrected data).
			_, _ = b.runner.Run(b.ctx, wf, buyRequest("order-1", 1, 1))
			require.Len(t, charges, 1, "charged under two downstream keys: %v", charges)
		})
	}
}
