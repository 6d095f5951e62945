package atomicphase_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

// versionsWorkflow builds workflow "w" with the given local phases, the
// last responding 200 with the phases the key ran, in commits of their own.
func versionsWorkflow(phases ...string) *atomicphase.Workflow[revSt] {
	return atomicphase.MustWorkflow("w", revStart, phasesOf(phases...), &atomicphase.WorkflowOpts{CommitEachPhase: true})
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

// retire makes every recorded workflow version look like the processes
// that ran it went away two days ago (past the default VersionHorizon).
func retire(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE atomicphase_workflow_versions SET seen_at = seen_at - interval '2 days'`)
	require.NoError(t, err)
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

	retire(t, b) // v1's processes are gone
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
	retire(t, b) // v1's processes are gone
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
	require.NoError(t, oldProc.Register(v1))
	require.NoError(t, newProc.Register(v1, v2))
	s, err := atomicphase.NewSweeper(newProc, nil)
	require.NoError(t, err)
	ageLocks(t, b)

	// k2 reaches the old process first: left alone, retryable, no attempt
	// counted (v2 was recorded by its first request).
	_, err = oldProc.Run(b.ctx, v1, revReq("k2"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	info, err := b.runner.Inspect(b.ctx, "u", "k2")
	require.NoError(t, err)
	require.Equal(t, 1, info.Attempts)
	// It rested; the new process's sweep finishes both keys.
	require.NoError(t, keystore.AgeBackoffs(b.ctx, b.db.Pool, ""))
	_, err = s.RunOnce(b.ctx)
	require.NoError(t, err)
	for key, want := range map[string]string{"k1": "k1,a,b,c", "k2": "k2,a,b2,c,d"} {
		resp, err := oldProc.Run(b.ctx, v1, revReq(key))
		require.NoError(t, err)
		require.Equal(t, want, string(resp.Body), key)
	}

	// Another v2 key stranded after a, retried at the old process: left
	// for the new process, not parked.
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

// a new deployment's first request records a key of its version before
// its process has announced that version (Run registers, it does not
// announce; the announce comes with the process's first sweep, or never
// without one). The old deployment's sweep, running meanwhile, finds a key
// of a version "nobody recorded" and parks it for good, while the process
// that started it is alive and serving.
func TestNewVersionIsRecordedByItsFirstRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "b2", "c")
	// The old deployment: v1, sweeping.
	require.NoError(t, b.runner.Register(v1))
	oldSweep := newSweeper(t, b, nil)
	_, err := oldSweep.RunOnce(b.ctx)
	require.NoError(t, err)

	// The new deployment's process is up and serves its first request,
	// which fails retryably after a (a downstream hiccup).
	fail := true
	newProc, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			if fail && at.Phase == "b2" && at.Place == atomicphase.BeforePhase {
				fail = false
				return errors.New("downstream hiccup")
			}
			return nil
		}),
	})
	require.NoError(t, err)
	_, err = newProc.Run(b.ctx, v2, revReq("k"))
	require.Error(t, err)
	require.True(t, atomicphase.Retryable(err), "%v", err)
	require.NoError(t, keystore.AgeBackoffs(b.ctx, b.db.Pool, ""))

	// The old deployment's sweep runs before the new process's first sweep.
	_, err = oldSweep.RunOnce(b.ctx)
	require.NoError(t, err)
	isParked, why := parked(t, b, "u", "k")
	require.False(t, isParked, "parked while the process that runs its version is alive: %s", why)

	// The client's retry reaches the live v2 process.
	resp, err := newProc.Run(b.ctx, v2, revReq("k"))
	require.NoError(t, err)
	require.Equal(t, "k,a,b2,c", string(resp.Body))
}

// a key recorded without a version (by the previous release) whose
// recovery point only another deployment's version has is taken by this
// process's sweep on every sweep, each take counting an attempt (the
// release rests it for a fixed AttemptBackoff, not growing, and
// notRunnableHere runs before the MaxAttempts check). When the process that
// runs it gets to it, its own sweep parks it as exhausted, though it never
// failed once.
func TestUnversionedKeyIsNotRetakenByAProcessThatCannotRunIt(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 5})
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v1, "b", "legacy")
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET workflow_version = NULL`)
	require.NoError(t, err)

	// Process B runs v1 (it records its versions; its sweep is slower).
	procB, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{MaxAttempts: 5})
	require.NoError(t, err)
	require.NoError(t, procB.Register(v1))
	require.NoError(t, procB.RecordVersions(b.ctx))

	// Process A runs v2 only and sweeps every few seconds.
	require.NoError(t, b.runner.Register(v2))
	sA := newSweeper(t, b, nil)
	for range 10 {
		_, err := sA.RunOnce(b.ctx)
		require.NoError(t, err)
		require.NoError(t, keystore.AgeBackoffs(b.ctx, b.db.Pool, "")) // a second passes
	}
	info, err := b.runner.Inspect(b.ctx, "u", "legacy")
	require.NoError(t, err)
	t.Logf("attempts after 10 sweeps of the process that cannot run it: %d", info.Attempts)

	sB, err := atomicphase.NewSweeper(procB, nil)
	require.NoError(t, err)
	_, err = sB.RunOnce(b.ctx)
	require.NoError(t, err)
	info, err = b.runner.Inspect(b.ctx, "u", "legacy")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "%+v", info)
}

// the same attempt inflation through a client's retries of a v1 key
// that its load balancer keeps sending to a v2-only process (409 each
// time): the v1 process's sweep then parks the key as exhausted.
func TestRetriesAtTheOtherDeploymentCountNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 5})
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v1, "b", "k")
	procV1, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{MaxAttempts: 5})
	require.NoError(t, err)
	require.NoError(t, procV1.Register(v1))
	require.NoError(t, procV1.RecordVersions(b.ctx))

	for range 6 { // the client's retries, all routed to the v2 process
		_, err := b.runner.Run(b.ctx, v2, revReq("k"))
		require.ErrorIs(t, err, atomicphase.ErrInProgress)
	}
	require.NoError(t, keystore.AgeBackoffs(b.ctx, b.db.Pool, ""))
	s, err := atomicphase.NewSweeper(procV1, nil)
	require.NoError(t, err)
	_, err = s.RunOnce(b.ctx)
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "%+v", info)
}

// FindDownstreamKey hashes a key with the foreign phases of the first
// definition registered under its workflow name, not of the key's own
// version: a v1 key whose foreign phase v2 removed (or v2 first registered)
// cannot be found from its webhook.
func TestFindDownstreamKeyOfAnOldVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var sent string
	call := func(_ context.Context, c *atomicphase.ForeignCall, _ *revSt) error {
		sent = c.Key()
		return nil
	}
	respond := func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
		return atomicphase.Respond(200, nil), nil
	}
	cont := func(context.Context, atomicphase.Tx, *revSt) (atomicphase.Outcome, error) {
		return atomicphase.Continue(), nil
	}
	v1 := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("a", cont), atomicphase.Foreign("receipt", call, respond)}, nil)
	v2 := atomicphase.MustWorkflow("w", revStart, []atomicphase.Phase[revSt]{
		atomicphase.Local("a", respond)}, nil)
	require.NoError(t, b.runner.Register(v2, v1)) // both versions, new first
	old, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = old.Run(b.ctx, v1, revReq("k"))
	require.NoError(t, err)
	require.NotEmpty(t, sent)
	m, err := b.runner.FindDownstreamKey(b.ctx, "u", sent)
	require.NoError(t, err, "the v1 key's receipt is registered here (v1 is)")
	require.Equal(t, "k", m.Key.Key)
}

// a key recorded by the release before versions (workflow_version
// NULL) started under v1. The new build registers v1 beside v2, as the
// runbook says; the client's retry arrives with v2 (the definition new
// requests run). definitionFor prefers the caller's definition when it has
// the recovery point, so the v1 key finishes under v2: c is skipped, d runs.
func TestUnversionedKeyRunsUnderTheFirstRegisteredDefinition(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "b", "d")
	strand(t, b, v1, "b", "legacy")
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET workflow_version = NULL`) // the previous release's key
	require.NoError(t, err)
	require.NoError(t, b.runner.Register(v1, v2))
	resp, err := b.runner.Run(b.ctx, v2, revReq("legacy"))
	require.NoError(t, err)
	require.Equal(t, "legacy,a,b,c", string(resp.Body), "the key started under v1")
}

// during the first deploy of a versions-aware build, the previous
// release's processes (which record no versions) still run the keys they
// started; the new build, which registers only the new definition, parks
// such a key for good at its first sweep. Before this change the sweep
// left it alone for the old processes.
func TestUnversionedKeyIsNeverParkedForAMissingPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1 := versionsWorkflow("a", "b", "c")
	v2 := versionsWorkflow("a", "c")
	strand(t, b, v1, "b", "legacy")
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET workflow_version = NULL`)
	require.NoError(t, err)
	require.NoError(t, b.runner.Register(v2))
	_, err = newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	isParked, why := parked(t, b, "u", "legacy")
	require.False(t, isParked, "parked for good: %s", why)
}

// two builds that declare the same WorkflowOpts.Version for different
// phase lists (a version string not bumped): the second to record it is
// refused, its keys left to the first, its requests answered with the
// error, so that no key of build A resumes under build B's definition.
func TestOneDeclaredVersionWithTwoPhaseListsIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mk := func(phases ...string) *atomicphase.Workflow[revSt] {
		return atomicphase.MustWorkflow("w", revStart, phasesOf(phases...), &atomicphase.WorkflowOpts{CommitEachPhase: true, Version: "2024-06"})
	}
	a := mk("a", "b", "c")
	bb := mk("a", "b", "d")
	strand(t, b, a, "b", "k")
	procB, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, procB.Register(bb))
	err = procB.RecordVersions(b.ctx)
	require.ErrorIs(t, err, keystore.ErrVersionShape, "the clash is noticed")
	_, err = procB.Resume(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrInProgress, "build A's key is left to build A")
	_, err = procB.Run(b.ctx, bb, revReq("other"))
	require.ErrorIs(t, err, keystore.ErrVersionShape, "and build B refuses the version's requests")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "b", info.RecoveryPoint, "nothing of build A's key ran under build B")
}

// A rolled-back canary declared "v3" for a phase list, and its processes
// are gone (unseen past the horizon) with none of its keys unfinished: the
// corrected build's own "v3" takes the name and serves its requests. While
// the canary's process may still run it, or a key of it is unfinished, the
// name stays the canary's. Before, the corrected build refused every
// request for ever.
func TestGoneAndDrainedDeclaredVersionCanBeReused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mk := func(phases ...string) *atomicphase.Workflow[revSt] {
		return atomicphase.MustWorkflow("w", revStart, phasesOf(phases...), &atomicphase.WorkflowOpts{CommitEachPhase: true, Version: "v3"})
	}
	canary, fixed := mk("a", "b", "c"), mk("a", "c")
	canaryProc, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, canaryProc.Register(canary))
	_, err = canaryProc.Run(b.ctx, canary, revReq("done-under-canary"))
	require.NoError(t, err)
	strand(t, b, canary, "b", "stranded") // one key of the canary unfinished

	proc, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, proc.Register(fixed))
	require.ErrorIs(t, proc.RecordVersions(b.ctx), keystore.ErrVersionShape, "the canary's process may still run it")
	retire(t, b)
	require.ErrorIs(t, proc.RecordVersions(b.ctx), keystore.ErrVersionShape, "gone, but a key of it is unfinished")

	// The canary's build finishes its key once more (resumed by hand): the
	// version is drained.
	_, err = canaryProc.Resume(b.ctx, "u", "stranded")
	require.NoError(t, err)
	retire(t, b)
	require.NoError(t, proc.RecordVersions(b.ctx), "gone and drained: the name is the fixed build's")
	resp, err := proc.Run(b.ctx, fixed, revReq("new"))
	require.NoError(t, err)
	require.Equal(t, "new,a,c", string(resp.Body))
}

// phasesOf builds local phases named phases, the last responding 200 with
// the phases the key ran.
func phasesOf(phases ...string) []atomicphase.Phase[revSt] {
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
	return ps
}
