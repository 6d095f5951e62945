package atomicphase_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

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
		{"duplicate", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop), atomicphase.Local("a", noop)}, []string{`both use the name "a"`}},
		{"former name clash", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop), atomicphase.Local("b", noop).WithFormerNames("a")}, []string{`both use the name "a"`}},
		{"reserved former name", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop).WithFormerNames("finished")}, []string{`"finished" is a reserved`}},
		{"jump to a former name", "w", []atomicphase.Phase[S]{atomicphase.Local("a", noop).WithJumps("old"), atomicphase.Local("b", noop).WithFormerNames("old")}, []string{`a former name; jump to "b"`}},
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
			_, err := atomicphase.NewWorkflow(c.wfName, startEmpty[S], c.phases, nil)
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	require.Panics(t, func() { atomicphase.MustWorkflow[struct{}, S]("w", startEmpty[S], nil, nil) })
	_, err := atomicphase.NewWorkflow[struct{}, S]("w", nil, []atomicphase.Phase[S]{atomicphase.Local("a", noop)}, nil)
	require.ErrorContains(t, err, "start function is nil")
}

func TestJumpToUndeclaredTargetFailsThePhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf, err := atomicphase.NewWorkflow("bad-jump", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("a", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.JumpTo("c"), nil
		}),
		atomicphase.Local("b", noop),
		atomicphase.Local("c", noop),
	}, nil)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "does not declare with WithJumps")
	require.ErrorIs(t, err, atomicphase.ErrPermanent, "a programming error no retry can fix")
}

// Renaming a phase strands no key: the workflow declares the former name,
// and keys stopped there resume after the renamed phase. Without it, the
// key is parked rather than retried forever.
func TestRenamedPhaseResumesKeysAtItsFormerName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{ Steps []string }
	var failSecond atomic.Bool
	failSecond.Store(true)
	second := atomicphase.Local("second", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
		if failSecond.Load() {
			return atomicphase.Outcome{}, errors.New("transient")
		}
		s.Steps = append(s.Steps, "second")
		return atomicphase.Respond(200, []byte(strings.Join(s.Steps, ","))), nil
	})
	v1 := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			s.Steps = append(s.Steps, "first")
			return atomicphase.Continue(), nil
		}),
		second,
	}, &atomicphase.WorkflowOpts{CommitEachPhase: true}) // the key stops at "first"
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"}
	_, err := b.runner.Run(b.ctx, v1, req)
	require.Error(t, err)
	failSecond.Store(false)

	renamedWithout := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("prepare", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		second,
	}, nil)
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	retire(t, b) // the processes that ran v1 are gone
	_, err = other.Run(b.ctx, renamedWithout, req)
	require.ErrorIs(t, err, atomicphase.ErrPermanent, "an unknown recovery point is no transient error")
	isParked, why := parked(t, b, "u", "k")
	require.True(t, isParked)
	require.Contains(t, why, `"first"`)

	renamed := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("prepare", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}).WithFormerNames("first"),
		second,
	}, nil)
	third, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = third.Run(b.ctx, renamed, req)
	require.ErrorIs(t, err, atomicphase.ErrParked, "a parked key waits for the operator, fix deployed or not")
	require.NoError(t, third.Unpark(b.ctx, "u", "k"))
	resp, err := third.Run(b.ctx, renamed, req)
	require.NoError(t, err)
	require.Equal(t, "first,second", string(resp.Body))
}
