package atomicphase_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// versionsWorkflow builds workflow "w" with the given local phases, the
// last responding 200 with the phases the key ran, in commits of their own.
func versionsWorkflow(phases ...string) *atomicphase.Workflow[revSt] {
	var ps []atomicphase.Phase[revSt]
	for i, name := range phases {
		last := i == len(phases)-1
		ps = append(ps, atomicphase.Local(name, func(_ context.Context, _ atomicphase.Tx, s *revSt) (atomicphase.Outcome, error) {
			s.Name += "," + name
			if last {
				return atomicphase.Respond(200, []byte(s.Name)), nil
			}
			return atomicphase.Continue(), nil
		}))
	}
	return atomicphase.MustWorkflow("w", revStart, ps, &atomicphase.WorkflowOpts{CommitEachPhase: true})
}

// strand leaves key recorded under wf, stopped after its phase at (its
// process died there), and nobody holding it.
func strand(t *testing.T, b *testBundle, wf *atomicphase.Workflow[revSt], at, key string) {
	t.Helper()
	r, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{FaultInjector: crashOnce(at, atomicphase.AfterCommit)})
	require.NoError(t, err)
	_, err = r.Run(b.ctx, wf, revReq(key))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
}

// A deploy removed the phase keys were stopped after, and no process runs
// their version any more: the sweep parks them, with an error naming the
// version and the phase, instead of taking them again and again at the
// head of its queue, where they kept another tenant's abandoned key from
// ever being reached (with a batch of 2, after 5 sweeps).
func TestRemovedPhaseParksItsKeysAndStarvesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	for _, k := range []string{"old1", "old2", "old3"} {
		strand(t, b, v1, "b", k)
	}
	// Another tenant's key of the new version, abandoned after a.
	r, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{FaultInjector: crashOnce("a", atomicphase.AfterCommit)})
	require.NoError(t, err)
	other := atomicphase.Request{Scope: "other", Key: "new", Method: "POST", Path: "/r", Params: []byte(`{"name":"new"}`)}
	_, err = r.Run(b.ctx, v2, other)
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)

	require.NoError(t, b.runner.Register(v2))
	s := newSweeper(t, b, &atomicphase.SweepConfig{BatchSize: 2})
	for range 5 {
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	info, err := b.runner.Inspect(b.ctx, "other", "new")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "the other tenant's key was reached")
	for _, k := range []string{"old1", "old2", "old3"} {
		isParked, why := parked(t, b, "u", k)
		require.True(t, isParked, k)
		require.Contains(t, why, v1.Version())
		require.Contains(t, why, `"b"`)
		require.Contains(t, why, "not deployed")
		info, err := b.runner.Inspect(b.ctx, "u", k)
		require.NoError(t, err)
		require.LessOrEqual(t, info.Attempts, 2, "taken once, to be parked, and never again")
	}
	// Deployed again, and unparked, each finishes under its own version.
	require.NoError(t, b.runner.Register(v1))
	require.NoError(t, b.runner.Unpark(b.ctx, "u", "old1"))
	resp, err := b.runner.Resume(b.ctx, "u", "old1")
	require.NoError(t, err)
	require.Equal(t, "old1,a,b,c", string(resp.Body))
}

// A client's retry of a key whose version no deployed process runs is
// answered at once: parked, with the version named; not run.
func TestClientRetryOfAnUndeployedVersionParksAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v1, "b", "k")
	_, err := b.runner.Run(b.ctx, v2, revReq("k"))
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.ErrorContains(t, err, v1.Version())
	isParked, _ := parked(t, b, "u", "k")
	require.True(t, isParked)
	_, err = b.runner.Run(b.ctx, v2, revReq("k"))
	require.ErrorIs(t, err, atomicphase.ErrParked, "a retry runs nothing")
}

// Two processes of a rolling deploy share the database: the old one runs
// v1 only, the new one v1 and v2. Each key resumes under its own version's
// definition, wherever it lands; a v2 key that reaches the old process is
// left for the new one, unharmed.
func TestEachKeyResumesUnderItsOwnVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "b2", "c", "d")
	strand(t, b, v1, "a", "k1")
	strand(t, b, v2, "a", "k2")

	oldProc, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	newProc, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, newProc.Register(v1, v2))
	for _, r := range []*atomicphase.Runner{oldProc, newProc} {
		s, err := atomicphase.NewSweeper(r, &atomicphase.SweepConfig{BatchSize: 0})
		require.NoError(t, err)
		require.NoError(t, r.Register(v1))
		_ = s
	}
	// The new process records its versions, as its sweep does.
	s, err := atomicphase.NewSweeper(newProc, nil)
	require.NoError(t, err)
	ageLocks(t, b)

	// k2 reaches the old process first: left alone, retryable.
	_, err = oldProc.Run(b.ctx, v1, revReq("k2"))
	require.Error(t, err)
	require.ErrorIs(t, err, atomicphase.ErrPermanent, "v2 is not deployed yet: nobody recorded it")
	require.NoError(t, newProc.Unpark(b.ctx, "u", "k2"))
	_, err = s.RunOnce(b.ctx) // records v1 and v2, and finishes both keys
	require.NoError(t, err)
	for key, want := range map[string]string{"k1": "k1,a,b,c", "k2": "k2,a,b2,c,d"} {
		resp, err := oldProc.Run(b.ctx, v1, revReq(key))
		require.NoError(t, err)
		require.Equal(t, want, string(resp.Body), key)
	}

	// A fresh v2 key stranded after a, retried at the old process now that
	// v2 is deployed: left for the new process, not parked.
	strand(t, b, v2, "a", "k3")
	_, err = oldProc.Run(b.ctx, v1, revReq("k3"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	require.True(t, atomicphase.Retryable(err))
	isParked, _ := parked(t, b, "u", "k3")
	require.False(t, isParked)
	resp, err := newProc.Run(b.ctx, v2, revReq("k3"))
	require.NoError(t, err)
	require.Equal(t, "k3,a,b2,c,d", string(resp.Body))
}

// Versions lists each version's processes and unfinished keys: an operator
// deletes v1 once it is drained.
func TestVersionsTellsWhenAVersionIsDrained(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{VersionHorizon: time.Hour})
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v1, "b", "k1")
	require.NoError(t, b.runner.Register(v1, v2))
	_, err := newSweeper(t, b, &atomicphase.SweepConfig{BatchSize: 1, Interval: time.Hour}).RunOnce(b.ctx)
	require.NoError(t, err)
	vs, err := b.runner.Versions(b.ctx)
	require.NoError(t, err)
	byVersion := map[string]atomicphase.VersionStatus{}
	for _, v := range vs {
		require.Equal(t, "w", v.Workflow)
		byVersion[v.Version] = v
	}
	require.True(t, byVersion[v1.Version()].Deployed)
	require.True(t, byVersion[v1.Version()].Drained(), "the sweep finished k1 under v1")
	require.Equal(t, []string{"a", "c"}, byVersion[v2.Version()].Phases)

	strand(t, b, v1, "a", "k2")
	vs, err = b.runner.Versions(b.ctx)
	require.NoError(t, err)
	for _, v := range vs {
		if v.Version == v1.Version() {
			require.Equal(t, 1, v.Unfinished)
			require.NotNil(t, v.Oldest)
			require.False(t, v.Drained())
		}
	}
}
