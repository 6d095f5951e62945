package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

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
	// Unmarked (Request.Retry), the retry's first phase began ahead of the
	// key's read, and stopped at its first statement: phase 1's write is
	// not made again.
	require.Equal(t, int32(2), c.charge.Load())
	require.Equal(t, firstOrderID, seenOrderID, "phase 2 sees the state phase 1 committed")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'create'"))
}

type jumpState struct {
	Express bool     `json:"express"`
	Trail   []string `json:"trail"`
}

func jumpWorkflow(t *testing.T, failAt string, failures *int, commitEach bool) *atomicphase.Workflow[jumpState] {
	step := func(name string, out func(s *jumpState) atomicphase.Outcome) atomicphase.LocalFunc[jumpState] {
		return func(ctx context.Context, tx atomicphase.Tx, s *jumpState) (atomicphase.Outcome, error) {
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
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true, CommitEachPhase: commitEach}) // the tests read the finished state
	require.NoError(t, err)
	return wf
}

func TestJumpSkipsPhasesAndSurvivesResume(t *testing.T) {
	t.Parallel()
	for _, commitEach := range []bool{true, false} {
		t.Run(fmt.Sprintf("CommitEachPhase=%v", commitEach), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			failures := 1
			wf := jumpWorkflow(t, "ship", &failures, commitEach)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/ship", Params: []byte(`{"express":true}`)}

			_, err := b.runner.Run(b.ctx, wf, req)
			require.ErrorContains(t, err, "transient")
			info, err := b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			if commitEach {
				require.Equal(t, "check", info.RecoveryPoint, "the jump is stored with check's commit")
			} else {
				require.Equal(t, atomicphase.RecoveryPointStarted, info.RecoveryPoint, "check and ship share a transaction, rolled back together")
			}

			_, err = b.runner.Run(b.ctx, wf, req)
			require.NoError(t, err)
			info, err = b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			require.JSONEq(t, `{"express":true,"trail":["check","ship"]}`, string(info.State), "review was skipped, before and after the retry")
		})
	}
}

// A phase resumed after a crash sees the very state bytes the first attempt
// committed, so what it sends downstream under the same key is identical.
func TestStateBytesAreTheSameWhenResumed(t *testing.T) {
	t.Parallel()
	type st struct {
		Extra json.RawMessage `json:"extra"`
		Z     int             `json:"z"`
		A     float64         `json:"a"`
	}
	type in struct {
		Extra json.RawMessage `json:"extra"`
	}
	sent := &seen{}
	var fail atomic.Bool
	wf := atomicphase.MustWorkflow("verbatim", func(i in, _ *atomicphase.Request) (st, error) {
		return st{Extra: i.Extra, Z: 1, A: 1e21}, nil
	}, []atomicphase.Phase[st]{
		atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("send", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			b, _ := json.Marshal(s)
			sent.add(string(b))
			if fail.Swap(false) {
				return errors.New("downstream 503")
			}
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/v",
		Params: []byte(`{"extra": {"b": 1e2, "a": [1.50, "x"]}}`)}

	clean := setup(t, nil)
	_, err := clean.runner.Run(clean.ctx, wf, req)
	require.NoError(t, err)

	resumed := setup(t, nil)
	fail.Store(true)
	_, err = resumed.runner.Run(resumed.ctx, wf, req)
	require.Error(t, err)
	_, err = resumed.runner.Run(resumed.ctx, wf, req)
	require.NoError(t, err)

	all := sent.all()
	require.Len(t, all, 3)
	require.Equal(t, all[0], all[1], "the first attempt after the first phase")
	require.Equal(t, all[0], all[2], "the resumed attempt sees the bytes the first one committed")
}

// A finished key keeps only what a replay needs.
func TestFinishedKeyKeepsNoState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	params := []byte(`{"item":"card tok_secret","quantity":1}`)
	_, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy", Params: params})
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Nil(t, info.State)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE state IS NOT NULL`))

	kept := atomicphase.MustWorkflow("kept", startShop, []atomicphase.Phase[shopState]{
		atomicphase.Local("done", func(ctx context.Context, tx atomicphase.Tx, s *shopState) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true})
	_, err = b.runner.Run(b.ctx, kept, atomicphase.Request{Scope: "u", Key: "k2", Method: "POST", Path: "/buy", Params: params})
	require.NoError(t, err)
	info, err = b.runner.Inspect(b.ctx, "u", "k2")
	require.NoError(t, err)
	require.JSONEq(t, `{"item":"card tok_secret","quantity":1}`, string(info.State))
}
