package atomicphase_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestRunPhaseErrorResumesAtFailedPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	failCharge := true
	var seenOrderID int64
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		seenOrderID = s.OrderID
		if failCharge {
			return errors.New("payment API unreachable")
		}
		return call.Do(ctx, func(ctx context.Context, key string) error { s.ChargeID = "ch_1"; return nil })
	}})

	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "charge", pe.Phase)
	require.ErrorContains(t, err, "payment API unreachable")

	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint, "phase 1 committed with its recovery point")
	require.False(t, info.Locked, "a phase error unlocks the key")
	require.Nil(t, info.Response, "nothing is stored for a transient failure")
	firstOrderID := seenOrderID
	require.NotZero(t, firstOrderID)

	failCharge = false
	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, int32(1), c.create.Load(), "phase 1 is not run again")
	require.Equal(t, int32(2), c.charge.Load())
	require.Equal(t, firstOrderID, seenOrderID, "phase 2 sees the state phase 1 committed")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'create'"))
}

type jumpState struct {
	Express bool     `json:"express"`
	Trail   []string `json:"trail"`
}

func jumpWorkflow(t *testing.T, failAt string, failures *int) *atomicphase.Workflow[jumpState] {
	step := func(name string, out func(s *jumpState) atomicphase.Outcome) atomicphase.LocalFunc[jumpState] {
		return func(ctx context.Context, tx pgx.Tx, s *jumpState) (atomicphase.Outcome, error) {
			if name == failAt && *failures > 0 {
				*failures--
				return atomicphase.Outcome{}, errors.New("transient")
			}
			s.Trail = append(s.Trail, name)
			return out(s), nil
		}
	}
	wf, err := atomicphase.NewWorkflow("jumpy", func(in struct {
		Express bool `json:"express"`
	}, _ *atomicphase.Request) (jumpState, error) {
		return jumpState{Express: in.Express}, nil
	}, []atomicphase.Phase[jumpState]{
		atomicphase.Local("check", step("check", func(s *jumpState) atomicphase.Outcome {
			if s.Express {
				return atomicphase.JumpTo("ship")
			}
			return atomicphase.Continue()
		})).WithJumps("ship"),
		atomicphase.Local("review", step("review", func(*jumpState) atomicphase.Outcome { return atomicphase.Continue() })),
		atomicphase.Local("ship", step("ship", func(s *jumpState) atomicphase.Outcome {
			return atomicphase.Respond(200, []byte(`"done"`))
		})),
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true}) // the tests read the finished state
	require.NoError(t, err)
	return wf
}

func TestJumpSkipsPhasesAndSurvivesResume(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	failures := 1
	wf := jumpWorkflow(t, "ship", &failures)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/ship", Params: []byte(`{"express":true}`)}

	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorContains(t, err, "transient")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "check", info.RecoveryPoint)

	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.JSONEq(t, `{"express":true,"trail":["check","ship"]}`, string(info.State), "review was skipped, before and after the retry")
}
