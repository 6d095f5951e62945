package atomicphase

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Runner runs workflows against the key store. It is safe for concurrent use.
type Runner struct {
	pool *pgxpool.Pool
	cfg  Config
	// store is the key table, seen with cfg.LockTimeout.
	store *keystore.Store

	mu        sync.RWMutex
	workflows map[string]AnyWorkflow
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
		workflows: map[string]AnyWorkflow{}}, nil
}

// Register makes workflows resumable by name with Resume. Run registers the
// workflow it runs, so Register is only needed in processes that resume keys
// they did not start (a background completer, say). A workflow with the
// same definition as one registered under its name (the same phases,
// kinds, options and state type: two values built by one constructor, say)
// is accepted and changes nothing; registering a different definition
// under a name already taken is an error that says what differs.
func (r *Runner) Register(workflows ...AnyWorkflow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, wf := range workflows {
		if wf == nil || wf.isNil() {
			return errors.New("atomicphase: Register given a nil workflow")
		}
		if have, ok := r.workflows[wf.Name()]; ok {
			if have == wf {
				continue
			}
			if diff := definitionDiff(have.definition(), wf.definition()); diff != "" {
				return fmt.Errorf("atomicphase: another definition of workflow %q is already registered: %s", wf.Name(), diff)
			}
			continue // the same definition: the registered one runs its keys
		}
		r.workflows[wf.Name()] = wf
	}
	return nil
}

// register registers wf unless it already is: one read lock on the hot path.
func (r *Runner) register(wf AnyWorkflow) error {
	if have, ok := r.workflow(wf.Name()); ok && (have == wf || slices.Equal(have.definition(), wf.definition())) {
		return nil
	}
	return r.Register(wf)
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
