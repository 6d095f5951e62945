package atomicphase

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Runner runs workflows against the key store. It is safe for concurrent use.
type Runner struct {
	pool *pgxpool.Pool
	cfg  Config
	// store is the key table, seen with cfg.LockTimeout.
	store *keystore.Store

	mu sync.RWMutex
	// workflows are the registered workflows by name: the first version
	// registered under each; versions every version, by name and version.
	workflows map[string]AnyWorkflow
	versions  map[string]map[string]AnyWorkflow
	// order lists each workflow's versions in the order registered.
	order map[string][]AnyWorkflow
	// unrecorded is set when a version was registered that this process
	// has not recorded in the database yet (see RecordVersions).
	unrecorded atomic.Bool
	// conflicts are the registered versions another process recorded with
	// another phase list, by VersionRef: refused here.
	conflicts map[string]error
	// implicitCommits is set once the database is known to commit the
	// statements of one batch sent without BEGIN together (one
	// PostgreSQL, not Citus): a unit that has sent nothing before its
	// commit then goes without BEGIN and COMMIT (see attempt.commit).
	// Unset, every unit is sent inside BEGIN and COMMIT.
	implicitCommits atomic.Bool
	// recordFirst is set once migration 020 is known to be applied: a new
	// key whose first unit goes whole (it sends nothing before its
	// commit) is then recorded at the head of that unit's batch, with no
	// claim (keystore.Recording.QueueRecord), implicitly or, on Citus,
	// inside BEGIN and COMMIT.
	recordFirst atomic.Bool
	// assumeWays says, by pool, how its connections run the batches that
	// read the key at their head (assume_prepare.go): *pgxpool.Pool to
	// assumeWay.
	assumeWays sync.Map
}

// NewRunner returns a Runner that stores keys through pool, which must reach
// a database migrated with Migrate (or schema.sql). It does not touch the
// database; call CheckSchema to find out at start-up whether the schema is
// there. config may be nil for the defaults.
func NewRunner(pool *pgxpool.Pool, config *Config) (*Runner, error) {
	if pool == nil {
		return nil, errors.New("atomicphase: NewRunner needs a pool")
	}
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Runner{pool: pool, cfg: cfg, store: keystore.New(cfg.Schema, cfg.LockTimeout),
		workflows: map[string]AnyWorkflow{}, versions: map[string]map[string]AnyWorkflow{}, order: map[string][]AnyWorkflow{}, conflicts: map[string]error{}}, nil
}

// Register makes workflows resumable with Resume and the sweep: each key
// resumes under the registered definition of its own version
// (Workflow.Version). Run registers the workflow it runs, so Register is
// needed in processes that resume keys they did not start (a background
// completer, say), and in a deploy that changes a workflow: register the
// previous definition beside the new one until its keys are drained
// (Runner.Versions). A workflow with the same definition as one registered
// under its name and version (two values built by one constructor, say) is
// accepted and changes nothing; a different definition under the same name
// and version is an error that says what differs.
func (r *Runner) Register(workflows ...AnyWorkflow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, wf := range workflows {
		if wf == nil || wf.isNil() {
			return errors.New("atomicphase: Register given a nil workflow")
		}
		byVersion := r.versions[wf.Name()]
		if have, ok := byVersion[wf.Version()]; ok {
			if have == wf {
				continue
			}
			if diff := definitionDiff(have.definition(), wf.definition()); diff != "" {
				return fmt.Errorf("atomicphase: another definition of workflow %q version %q is already registered: %s", wf.Name(), wf.Version(), diff)
			}
			continue // the same definition: the registered one runs its keys
		}
		if byVersion == nil {
			byVersion = map[string]AnyWorkflow{}
			r.versions[wf.Name()] = byVersion
			r.workflows[wf.Name()] = wf
		}
		byVersion[wf.Version()] = wf
		r.order[wf.Name()] = append(r.order[wf.Name()], wf)
		r.unrecorded.Store(true)
	}
	return nil
}

// versionRefs lists every registered (workflow, version) pair as the key
// store writes them.
func (r *Runner) versionRefs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for name, byVersion := range r.versions {
		for v := range byVersion {
			out = append(out, keystore.VersionRef(name, v))
		}
	}
	return out
}

// phaseRefs lists every (workflow, phase) pair of the registered
// definitions, former names included, as the key store writes them.
func (r *Runner) phaseRefs() []string {
	var out []string
	for _, wf := range r.registeredVersions() {
		for _, p := range wf.phaseList() {
			out = append(out, keystore.VersionRef(wf.Name(), p))
		}
	}
	return out
}

// workflow returns the workflow registered under name.
func (r *Runner) workflow(name string) (AnyWorkflow, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	wf, ok := r.workflows[name]
	return wf, ok
}

// workflowNames lists the registered workflows' names.
func (r *Runner) workflowNames() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.workflows))
	for name := range r.workflows {
		names = append(names, name)
	}
	return names
}
