package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Workflow versions. Each key records the version of the definition it
// started under (Workflow.Version) and resumes under that definition, in
// whichever process registered it. Each process records the versions it
// registered in the database (atomicphase_workflow_versions) with its first
// request of each, as its sweep runs, and before it decides about a key it
// cannot run. A key no definition in this process can run is left to
// another deployment that runs it (released uncounted, to rest before it is
// tried again, so it never heads the sweep's queue), or, when no process
// recorded its version within Config.VersionHorizon, parked for good with
// an error that names the version: deploy it, then unpark the key.

// definitionFor returns the registered definition that runs row's key:
// the one of its version (preferred when it is that one); for a key
// recorded without a version, the first registered that has its recovery
// point. ok is false when none here can run it, or its version is refused
// here (declared for two phase lists).
func (r *Runner) definitionFor(row *keystore.Row, preferred AnyWorkflow) (AnyWorkflow, bool) {
	if row.WorkflowVersion != nil {
		v := *row.WorkflowVersion
		wf, ok := preferred, preferred != nil && preferred.Name() == row.Workflow && preferred.Version() == v
		if !ok {
			wf, ok = r.workflowVersion(row.Workflow, v)
		}
		return wf, ok && r.conflict(wf) == nil
	}
	// Recorded without a version (by a release older than versions): the
	// first definition registered that has its recovery point, whatever
	// the request's. Register the definition that release ran first.
	var jump string
	if row.JumpTarget != nil {
		jump = *row.JumpTarget
	}
	for _, wf := range r.definitionsOf(row.Workflow) {
		if _, err := wf.resumeAt(row.RecoveryPoint, jump); err == nil {
			return wf, true
		}
	}
	return nil, false
}

// definitionsOf lists the registered definitions of the workflow name, in
// the order registered.
func (r *Runner) definitionsOf(name string) []AnyWorkflow {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.order[name])
}

// errOtherVersion is the sweep's (and a caller's) answer for a key another
// deployment's workflow version runs.
var errOtherVersion = fmt.Errorf("%w: the key's workflow version runs in another deployment", ErrInProgress)

// notRunnableHere releases row's key, which no definition registered here
// can run: for another deployment that runs it (the returned error is
// retryable, the acquisition is not counted as an attempt, and the key
// rests before the sweep tries it again), or parked for good when no
// deployed process runs its version (a non-retryable *PhaseError naming
// what is missing). A key recorded without a version is never parked so: a
// release older than versions records none, and may still be running it.
func (r *Runner) notRunnableHere(ctx context.Context, row *keystore.Row, scope, key string) error {
	missing, err := r.missingEverywhere(ctx, row)
	if err != nil {
		_, uerr := r.release(ctx, scope, key, row.LockToken, err, r.cfg.AttemptBackoff, parkNot, false, false)
		return storeError("look up the deployed workflow versions", errors.Join(err, uerr))
	}
	if missing == "" || row.WorkflowVersion == nil {
		why := fmt.Errorf("%w (workflow %q, %s)", errOtherVersion, row.Workflow, versionText(row))
		if missing != "" {
			why = fmt.Errorf("%w: %s", why, missing)
		}
		// Not this process's to run: the take is no attempt of the key's.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		uerr := r.store.UndoAttempt(uctx, r.poolFor(scope), scope, key, row.LockToken)
		cancel()
		if uerr != nil {
			r.logKey(ctx, slog.LevelWarn, "atomicphase: could not uncount a take of another version's key", row.Workflow, scope, key, "error", uerr)
		}
		if _, err := r.release(ctx, scope, key, row.LockToken, why, r.cfg.AttemptBackoff, parkNot, false, false); err != nil {
			return err
		}
		// In progress elsewhere: a 409 over HTTP, as for any held key.
		return &InProgressError{RetryAfter: time.Second, Err: why}
	}
	why := fmt.Errorf("atomicphase: %s: deploy a build that registers it, then unpark the key", missing)
	// Parked for good without the definition that would tell which of its
	// phases called out: an attempt of it ran, and may have paid.
	if _, err := r.release(ctx, scope, key, row.LockToken, why, 0, parkFinal, false, true); err != nil {
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
	if err := r.announce(ctx); err != nil && !errors.Is(err, keystore.ErrVersionShape) {
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
	return fmt.Sprintf("no recorded version of workflow %q has the phase %q the key resumes at", row.Workflow, need), nil
}

// recordIfNew records the registered versions when one was registered
// since the last record: the first request of a version in this process
// records it before any other process can take its keys for another
// deployment's. One atomic load otherwise. A failure is logged; the
// request goes on (the sweep records them again).
func (r *Runner) recordIfNew(ctx context.Context) {
	if !r.unrecorded.Load() {
		return
	}
	if err := r.announce(ctx); err != nil {
		r.logKey(ctx, slog.LevelWarn, "atomicphase: could not record the workflow versions this process runs", "", "", "", "error", err)
	}
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

// announce records every registered version in the database, each with
// this process's release (the migration it needs, which a contract step
// reads): each process's heartbeat, on every sweep.
//
// A version another process recorded with another phase list (one
// WorkflowOpts.Version declared for two definitions) is refused here while
// that process may still run it: its keys are left to the process that
// recorded it first, and Run answers its requests with the error. Once no
// process has recorded it for Config.VersionHorizon and no unfinished key
// started under it (a rolled-back canary, say), the next announcement
// takes the name for this definition.
func (r *Runner) announce(ctx context.Context) error {
	r.unrecorded.Store(false)
	if !r.implicitCommits.Load() || !r.recordFirst.Load() {
		// Learnt with the first request's recording of the versions (or
		// the first sweep), which every process makes; until then, and if
		// it fails, units are sent inside BEGIN and COMMIT, and a new key
		// is claimed first. Asked again on every announcement until both
		// are known (on Citus, where units always go inside BEGIN and
		// COMMIT, at every announcement: two catalog reads): migration 020
		// may be applied, or its function distributed, while this process
		// runs.
		if citus, first, err := r.store.Features(ctx, r.pool); err == nil {
			// On one PostgreSQL a request's key writes are plain
			// statements, and a new key's recording heads its unit
			// (keystore's plain.go).
			r.store.SetPlain(!citus)
			r.implicitCommits.Store(!citus)
			r.recordFirst.Store(first || !citus)
		}
	}
	var errs []error
	for _, wf := range r.registeredVersions() {
		err := r.store.Announce(ctx, r.pool, MinVersion, wf.Name(), wf.Version(), wf.shape(), wf.phaseList(), r.cfg.VersionHorizon)
		ref := keystore.VersionRef(wf.Name(), wf.Version())
		switch {
		case errors.Is(err, keystore.ErrVersionShape):
			r.mu.Lock()
			r.conflicts[ref] = fmt.Errorf("atomicphase: %w", err)
			r.mu.Unlock()
			errs = append(errs, err)
		case err != nil:
			r.unrecorded.Store(true)
			return err
		default:
			// Recorded: the name is this definition's now, if it was not.
			r.mu.Lock()
			delete(r.conflicts, ref)
			r.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// conflict returns the error of a registered version another process
// recorded with another phase list, or nil.
func (r *Runner) conflict(wf AnyWorkflow) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if len(r.conflicts) == 0 {
		return nil
	}
	return r.conflicts[keystore.VersionRef(wf.Name(), wf.Version())]
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

// register registers wf unless it already is: one read lock on the hot path.
func (r *Runner) register(wf AnyWorkflow) error {
	if have, ok := r.workflowVersion(wf.Name(), wf.Version()); ok && (have == wf || slices.Equal(have.definition(), wf.definition())) {
		return nil
	}
	return r.Register(wf)
}

// workflowVersion returns the registered definition of version of the
// workflow name.
func (r *Runner) workflowVersion(name, version string) (AnyWorkflow, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	wf, ok := r.versions[name][version]
	return wf, ok
}

// registeredVersions lists every registered definition, in no order.
func (r *Runner) registeredVersions() []AnyWorkflow {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []AnyWorkflow
	for _, byVersion := range r.versions {
		for _, wf := range byVersion {
			out = append(out, wf)
		}
	}
	return out
}
