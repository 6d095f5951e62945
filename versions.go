package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Workflow versions. Each key records the version of the definition it
// started under (Workflow.Version) and resumes under that definition, in
// whichever process registered it. Each process records the versions it
// registered in the database (atomicphase_workflow_versions) as its sweep
// runs, and before it decides about a key it cannot run. A key no definition in this process can
// run is left to another deployment that runs it (unlocked, to be tried
// again later, so it never heads the sweep's queue), or, when no process
// recorded its version (or, for a key recorded without a version, a version
// with its recovery point) within Config.VersionHorizon, parked for good
// with an error that names what is missing: deploy it, then unpark the key.

// definitionFor returns the registered definition that runs row's key:
// the one of its version; for a key recorded without a version, the first
// (preferred first) that has its recovery point. ok is false when none
// here can run it.
func (r *Runner) definitionFor(row *keystore.Row, preferred AnyWorkflow) (AnyWorkflow, bool) {
	if row.WorkflowVersion != nil {
		v := *row.WorkflowVersion
		if preferred != nil && preferred.Name() == row.Workflow && preferred.Version() == v {
			return preferred, true
		}
		return r.workflowVersion(row.Workflow, v)
	}
	var jump string
	if row.JumpTarget != nil {
		jump = *row.JumpTarget
	}
	candidates := r.definitionsOf(row.Workflow)
	if preferred != nil && preferred.Name() == row.Workflow {
		candidates = append([]AnyWorkflow{preferred}, candidates...)
	}
	for _, wf := range candidates {
		if _, err := wf.resumeAt(row.RecoveryPoint, jump); err == nil {
			return wf, true
		}
	}
	return nil, false
}

// definitionsOf lists the registered definitions of the workflow name,
// sorted by version.
func (r *Runner) definitionsOf(name string) []AnyWorkflow {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]AnyWorkflow, 0, len(r.versions[name]))
	for _, wf := range r.versions[name] {
		out = append(out, wf)
	}
	slices.SortFunc(out, func(a, b AnyWorkflow) int {
		switch {
		case a.Version() < b.Version():
			return -1
		case a.Version() > b.Version():
			return 1
		}
		return 0
	})
	return out
}

// errOtherVersion is the sweep's (and a caller's) answer for a key another
// deployment's workflow version runs.
var errOtherVersion = fmt.Errorf("%w: the key's workflow version runs in another deployment", ErrInProgress)

// notRunnableHere releases row's key, which no definition registered here
// can run: for another deployment that runs it (the returned error is
// retryable, and the key rests before the sweep tries it again), or parked
// for good when no deployed process runs its version or has its recovery
// point (a non-retryable *PhaseError naming what is missing).
func (r *Runner) notRunnableHere(ctx context.Context, row *keystore.Row, scope, key string) error {
	missing, err := r.missingEverywhere(ctx, row)
	if err != nil {
		_, uerr := r.release(ctx, scope, key, row.LockToken, err, r.cfg.AttemptBackoff, parkNot, false)
		return storeError("look up the deployed workflow versions", errors.Join(err, uerr))
	}
	if missing == "" {
		why := fmt.Errorf("%w (workflow %q, %s)", errOtherVersion, row.Workflow, versionText(row))
		if _, err := r.release(ctx, scope, key, row.LockToken, why, r.cfg.AttemptBackoff, parkNot, false); err != nil {
			return err
		}
		return why
	}
	why := fmt.Errorf("atomicphase: %s: deploy a build that registers it, then unpark the key", missing)
	if _, err := r.release(ctx, scope, key, row.LockToken, why, 0, parkFinal, false); err != nil {
		return err
	}
	r.observe(ctx, Event{Kind: EventParked, Workflow: row.Workflow, Scope: scope, Key: key, Err: why})
	return &PhaseError{Workflow: row.Workflow, Err: Permanent(why), Parked: true}
}

// versionText names the version a key started under.
func versionText(row *keystore.Row) string {
	if row.WorkflowVersion == nil {
		return "recorded without a version, at recovery point " + fmt.Sprintf("%q", row.RecoveryPoint)
	}
	return fmt.Sprintf("version %q", *row.WorkflowVersion)
}

// missingEverywhere says what no deployed process has for row's key ("" when
// some process does): its version, or, for a key recorded without one, a
// version with its recovery point. This process's versions are recorded
// first, so they count.
func (r *Runner) missingEverywhere(ctx context.Context, row *keystore.Row) (string, error) {
	if err := r.announce(ctx); err != nil {
		return "", err
	}
	deployed, err := r.store.Deployed(ctx, r.pool, row.Workflow, r.cfg.VersionHorizon)
	if err != nil {
		return "", err
	}
	if row.WorkflowVersion != nil {
		if _, ok := deployed[*row.WorkflowVersion]; ok {
			return "", nil
		}
		return fmt.Sprintf("workflow %q version %q, which the key resumes in after %q, is not deployed (no process registered it within %s)",
			row.Workflow, *row.WorkflowVersion, row.RecoveryPoint, r.cfg.VersionHorizon), nil
	}
	need := row.RecoveryPoint
	if row.JumpTarget != nil {
		need = *row.JumpTarget
	}
	for _, phases := range deployed {
		if need == RecoveryPointStarted || slices.Contains(phases, need) {
			return "", nil
		}
	}
	return fmt.Sprintf("no deployed version of workflow %q has the phase %q the key resumes at", row.Workflow, need), nil
}

// RecordVersions records in the database that this process runs the
// workflow versions registered with it. The sweep does it on every run (a
// process's heartbeat for its versions); a process that runs no Sweeper
// calls it at start-up, after Register, and then at least once per
// Config.VersionHorizon, or another deployment's processes will park the
// keys of versions only it runs.
func (r *Runner) RecordVersions(ctx context.Context) error {
	if err := r.announce(ctx); err != nil {
		return storeError("record the workflow versions", err)
	}
	return nil
}

// announce records every registered version in the database: each
// process's heartbeat, on every sweep.
func (r *Runner) announce(ctx context.Context) error {
	for _, wf := range r.registeredVersions() {
		if err := r.store.Announce(ctx, r.pool, wf.Name(), wf.Version(), wf.phaseList()); err != nil {
			return err
		}
	}
	return nil
}

// VersionStatus is one workflow version as Runner.Versions reports it: the
// processes that run it, and the unfinished keys that started under it.
type VersionStatus struct {
	Workflow string
	// Version is the definition's version; "" for keys recorded without
	// one (by a release older than versions).
	Version string
	// Phases are the version's phases (former names included), as the
	// processes that run it recorded them; nil when none did.
	Phases []string
	// RegisteredAt is when a process first recorded the version; SeenAt
	// when one last did. Nil when no process ever did.
	RegisteredAt, SeenAt *time.Time
	// Deployed is true when a process recorded it within
	// Config.VersionHorizon.
	Deployed bool
	// Unfinished counts the version's unfinished keys, Parked and Unknown
	// those of them parked and waiting on an unknown outcome; Oldest is
	// when the oldest was recorded (nil when none).
	Unfinished, Parked, Unknown int
	Oldest                      *time.Time
}

// Drained reports whether no unfinished key started under the version: its
// definition may be deleted from the code once no process runs it either.
func (v VersionStatus) Drained() bool { return v.Unfinished == 0 }

// Versions lists, per workflow and version, the processes that run it and
// its unfinished, parked and unknown keys and the oldest, so an operator
// knows when an old definition can be deleted: when it is drained. It
// reads every unfinished key: an operator's query, off the request path.
func (r *Runner) Versions(ctx context.Context) ([]VersionStatus, error) {
	rows, err := r.store.Versions(ctx, r.pool)
	if err != nil {
		return nil, storeError("list workflow versions", err)
	}
	out := make([]VersionStatus, len(rows))
	for i, v := range rows {
		out[i] = VersionStatus{Workflow: v.Workflow, Version: v.Version, RegisteredAt: v.RegisteredAt, SeenAt: v.SeenAt,
			Unfinished: v.Unfinished, Parked: v.Parked, Unknown: v.Unknown, Oldest: v.Oldest}
		if v.SeenAt != nil {
			out[i].Phases = v.Phases
			out[i].Deployed = time.Since(*v.SeenAt) < r.cfg.VersionHorizon
		}
	}
	return out, nil
}
