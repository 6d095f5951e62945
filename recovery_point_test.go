package atomicphase_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func noop(context.Context, pgx.Tx, *struct{}) (atomicphase.Outcome, error) {
	return atomicphase.Continue(), nil
}

func TestNewWorkflowValidates(t *testing.T) {
	t.Parallel()
	type S = struct{}
	cases := []struct {
		name   string
		wfName string
		phases []atomicphase.Phase[S]
		want   []string
	}{
		{"empty list", "w", nil, []string{"at least one phase"}},
		{"empty workflow name", "", []atomicphase.Phase[S]{atomicphase.Local("a", noop)}, []string{"workflow name is empty"}},
		{"duplicate", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop), atomicphase.Local("a", noop)}, []string{`both named "a"`}},
		{"reserved started", "w", []atomicphase.Phase[S]{atomicphase.Local("started", noop)}, []string{`"started" is a reserved`}},
		{"reserved finished", "w", []atomicphase.Phase[S]{atomicphase.Local("finished", noop)}, []string{`"finished" is a reserved`}},
		{"no function", "w", []atomicphase.Phase[S]{atomicphase.Local[S]("a", nil)}, []string{`"a" has no function`}},
		{"missing jump target", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop).WithJumps("nowhere")}, []string{`jumps to "nowhere", which does not exist`}},
		{"backward jump", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop), atomicphase.Local("b", noop).WithJumps("a")}, []string{`jumps back to "a"`}},
		{"space in name", "w", []atomicphase.Phase[S]{atomicphase.Local("a b", noop)}, []string{"printable ASCII without spaces"}},
		{"all at once", "", []atomicphase.Phase[S]{atomicphase.Local("started", noop), atomicphase.Local("x", noop).WithJumps("y")},
			[]string{"workflow name is empty", `"started" is a reserved`, `jumps to "y"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := atomicphase.NewWorkflow(c.wfName, c.phases, nil)
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	require.Panics(t, func() { atomicphase.MustWorkflow[S]("w", nil, nil) })
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
	wf, err := atomicphase.NewWorkflow("jumpy", []atomicphase.Phase[jumpState]{
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
	}, nil)
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

func TestJumpToUndeclaredTargetFailsThePhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf, err := atomicphase.NewWorkflow("bad-jump", []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", func(context.Context, pgx.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.JumpTo("c"), nil
		}),
		atomicphase.Local("b", noop),
		atomicphase.Local("c", noop),
	}, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "does not declare with WithJumps")
}

func TestWorkflowEndingWithoutResponseFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf, err := atomicphase.NewWorkflow("silent", []atomicphase.Phase[struct{}]{atomicphase.Local("only", noop)}, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorIs(t, err, atomicphase.ErrNoResponse)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.RecoveryPointStarted, info.RecoveryPoint, "the phase rolled back")
}

func TestResumeContinuesWithoutTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{LockTimeout: 200 * time.Millisecond})
	var c counters
	fail := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		if fail {
			return errors.New("down")
		}
		return call.Do(ctx, func(context.Context, string) error { s.ChargeID = "ch_r"; return nil })
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.Error(t, err)

	// Another process: a fresh Runner that only registered the workflow.
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = other.Resume(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrUnknownWorkflow)
	info, err := other.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.False(t, info.Locked, "the refused resume unlocked the key again")

	require.NoError(t, other.Register(wf))
	fail = false
	resp, err := other.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Contains(t, string(resp.Body), `"charge_id":"ch_r"`)
	require.Equal(t, int32(1), c.create.Load())

	again, err := other.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, resp.Body, again.Body)

	_, err = other.Resume(b.ctx, "u", "never-seen")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)
}

func TestRegisterRefusesAnotherWorkflowWithTheSameName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	require.NoError(t, b.runner.Register(orderWorkflow(t, &c, hooks{})))
	require.ErrorContains(t, b.runner.Register(orderWorkflow(t, &c, hooks{})), "already registered")
}

func TestNewRunnerValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{LockTimeout: -time.Second, MaxKeyLength: -1, RetryBackoff: -1})
	require.ErrorContains(t, err, "Config.LockTimeout")
	require.ErrorContains(t, err, "Config.MaxKeyLength")
	require.ErrorContains(t, err, "Config.RetryBackoff")
	_, err = atomicphase.NewRunner(nil, nil)
	require.Error(t, err)
}
