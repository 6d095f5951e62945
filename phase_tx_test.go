package atomicphase_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/atomicphase/atomicphase"
	"github.com/stretchr/testify/require"
)

// Statements sent through tx.Conn() belong to the phase's transaction: they
// roll back with a failed phase.
func TestPhaseTxConnIsInsideTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("conn", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			if _, err := tx.Conn().Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'write')`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if fail.Swap(false) {
				return atomicphase.Outcome{}, errors.New("phase fails after writing")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "the failed phase's write survived")
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}
