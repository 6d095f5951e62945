package atomicphase

import (
	"context"
	"errors"
	"slices"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The reverse lookup: from a downstream key (ForeignCall.Key, what a
// downstream's webhook or support ticket quotes back) to the idempotency
// key whose phase sent it. A downstream key is a hash, so it cannot be read
// backwards; the lookup hashes the candidates instead: the keys of one
// scope, newest first, read by the primary key's index, each with the
// foreign phases of its workflow. It is scoped by construction: a caller
// who can name only its own scope can find only its own keys.

// DownstreamMatch is what FindDownstreamKey found: the key, and the phase
// whose foreign call sent the downstream key, by the name its downstream
// keys are derived from (its oldest, for a renamed phase: WithFormerNames).
type DownstreamMatch struct {
	Key   *KeyInfo
	Phase string
}

// ErrDownstreamKeyNotFound is returned by FindDownstreamKey when no key of
// the scope sent the downstream key (from a workflow this process knows).
var ErrDownstreamKeyNotFound = errors.New("atomicphase: no key of the scope sent this downstream key")

// FindDownstreamKey finds the key of scope whose foreign phase sent
// reference as its downstream idempotency key (ForeignCall.Key), and the phase: a
// webhook that quotes the downstream key can then be settled with
// ResolveUnknown. It reads the scope's keys, newest first, and hashes each
// with the foreign phases of its workflow, which must be registered with
// this Runner (Register, or Run once); keys of other workflows are passed
// over. Its cost grows with the scope's keys: give the narrowest scope the
// webhook lets you name. It returns ErrDownstreamKeyNotFound when no key
// matches.
func (r *Runner) FindDownstreamKey(ctx context.Context, scope, reference string) (*DownstreamMatch, error) {
	return r.findDownstream(ctx, scope, reference, func(workflow string) []string {
		// The foreign phases of every registered version: a key of an
		// older version may have called a phase the newer one dropped.
		var names []string
		for _, wf := range r.definitionsOf(workflow) {
			for _, st := range wf.phaseSteps() {
				if st.call != nil && !slices.Contains(names, st.downstreamName) {
					names = append(names, st.downstreamName)
				}
			}
		}
		return names
	})
}

// FindDownstreamKeyOf is FindDownstreamKey for a process that does not
// have the workflow's code (the CLI): it hashes the keys of scope that
// belong to workflow with the foreign phases named (each by its oldest
// name, the one its downstream keys are derived from).
func (r *Runner) FindDownstreamKeyOf(ctx context.Context, scope, reference, workflow string, phases ...string) (*DownstreamMatch, error) {
	if workflow == "" || len(phases) == 0 {
		return nil, errors.New("atomicphase: FindDownstreamKeyOf needs the workflow and its foreign phases' names")
	}
	return r.findDownstream(ctx, scope, reference, func(w string) []string {
		if w != workflow {
			return nil
		}
		return phases
	})
}

// InspectWithPhases is Inspect for a process that does not have the
// workflow's code (the CLI): besides the downstream keys of the foreign
// phases this Runner knows, KeyInfo.DownstreamKeys holds those of the
// phases named, each by the name its downstream keys are derived from (its
// oldest, for a renamed phase). Name foreign phases only: a local phase
// sends no downstream key, and the one computed for it is no one's.
func (r *Runner) InspectWithPhases(ctx context.Context, scope, key string, phases ...string) (*KeyInfo, error) {
	row, err := r.store.Inspect(ctx, r.poolFor(scope), scope, key)
	if err != nil {
		return nil, storeError("inspect key", err)
	}
	if row == nil {
		return nil, ErrKeyNotFound
	}
	info := r.keyInfo(row)
	for _, p := range phases {
		if info.DownstreamKeys == nil {
			info.DownstreamKeys = map[string]string{}
		}
		if _, ok := info.DownstreamKeys[p]; !ok {
			info.DownstreamKeys[p] = downstreamKey(row.DownstreamSalt, row.Workflow, scope, key, p)
		}
	}
	return info, nil
}

// findDownstream hashes the keys of scope with the phases phasesOf names
// for their workflow until one gives reference.
func (r *Runner) findDownstream(ctx context.Context, scope, reference string, phasesOf func(workflow string) []string) (*DownstreamMatch, error) {
	if scope == "" || reference == "" {
		return nil, errors.New("atomicphase: looking up a downstream key needs the scope and the downstream key")
	}
	var key, phase string
	err := r.store.EachScopeKey(ctx, r.poolFor(scope), scope, func(k keystore.ScopeKey) bool {
		for _, name := range phasesOf(k.Workflow) {
			if downstreamKey(k.Salt, k.Workflow, scope, k.Key, name) == reference {
				key, phase = k.Key, name
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, storeError("find downstream key", err)
	}
	if key == "" {
		return nil, ErrDownstreamKeyNotFound
	}
	info, err := r.Inspect(ctx, scope, key)
	if err != nil {
		return nil, err
	}
	return &DownstreamMatch{Key: info, Phase: phase}, nil
}
