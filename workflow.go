package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// maxNameLength keeps names readable in logs and indexes alike.
const maxNameLength = 63

// WorkflowOpts are optional settings of a Workflow. A nil *WorkflowOpts means
// all defaults.
type WorkflowOpts[S any] struct {
	// Start builds the initial state from the request before anything is
	// written; an error rejects the request with ErrInvalidRequest and
	// stores nothing. It runs on every attempt, so it must be a pure
	// function of the request. Defaults to decoding Request.Params (when
	// present) into S with encoding/json.
	Start func(req *Request) (S, error)

	// Isolation is the transaction isolation level of the workflow's
	// phases; a phase's WithIsolation overrides it. Defaults to PostgreSQL's
	// READ COMMITTED.
	Isolation pgx.TxIsoLevel
}

// Workflow is a named, validated, ordered list of phases over a state of type
// S. Its name is stored on every key it runs, so any process that registered
// it can resume the key. Build one with NewWorkflow.
type Workflow[S any] struct {
	name   string
	start  func(req *Request) (S, error)
	steps  []step
	byName map[string]int
}

// step is the state-type-free view of a phase that the Runner executes:
// states travel between phases as JSON, which is also how they are stored.
type step struct {
	name      string
	isolation pgx.TxIsoLevel
	// call is nil for local phases.
	call func(ctx context.Context, fc *ForeignCall, state []byte) ([]byte, error)
	// local is nil for a foreign phase that records nothing of its own.
	local func(ctx context.Context, tx pgx.Tx, state []byte) ([]byte, Outcome, error)
	jumps []string
}

// NewWorkflow validates phases and builds a Workflow. It reports every
// problem it finds: an empty name or phase list, duplicate or reserved phase
// names, a phase without a function, and jumps to phases that do not exist
// or do not come later.
func NewWorkflow[S any](name string, phases []Phase[S], opts *WorkflowOpts[S]) (*Workflow[S], error) {
	if opts == nil {
		opts = &WorkflowOpts[S]{}
	}
	wf := &Workflow[S]{name: name, start: opts.Start, byName: make(map[string]int, len(phases))}
	if wf.start == nil {
		wf.start = decodeParams[S]
	}

	var errs []error
	if err := checkName("workflow name", name); err != nil {
		errs = append(errs, err)
	}
	if len(phases) == 0 {
		errs = append(errs, errors.New("a workflow needs at least one phase"))
	}
	for i, p := range phases {
		if err := checkName(fmt.Sprintf("phase %d name", i), p.name); err != nil {
			errs = append(errs, err)
		} else if p.name == RecoveryPointStarted || p.name == RecoveryPointFinished {
			errs = append(errs, fmt.Errorf("phase %d: %q is a reserved recovery point; choose another name", i, p.name))
		} else if j, dup := wf.byName[p.name]; dup {
			errs = append(errs, fmt.Errorf("phases %d and %d are both named %q; names must be unique", j, i, p.name))
		} else {
			wf.byName[p.name] = i
		}
		if p.local == nil && p.call == nil {
			errs = append(errs, fmt.Errorf("phase %q has no function", p.name))
		}
		iso := p.isolation
		if iso == "" {
			iso = opts.Isolation
		}
		wf.steps = append(wf.steps, makeStep(p, iso))
	}
	for i, p := range phases {
		for _, target := range p.jumps {
			j, ok := wf.byName[target]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("phase %q jumps to %q, which does not exist", p.name, target))
			case j <= i:
				errs = append(errs, fmt.Errorf("phase %q jumps back to %q; jumps must go forward so the workflow ends", p.name, target))
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("atomicphase: workflow %q is invalid: %w", name, errors.Join(errs...))
	}
	return wf, nil
}

// MustWorkflow is like NewWorkflow but panics if the workflow is invalid. It
// is meant for package-level declarations whose validity is fixed at compile
// time.
func MustWorkflow[S any](name string, phases []Phase[S], opts *WorkflowOpts[S]) *Workflow[S] {
	wf, err := NewWorkflow(name, phases, opts)
	if err != nil {
		panic(err)
	}
	return wf
}

// Name returns the workflow's name.
func (w *Workflow[S]) Name() string { return w.name }

// Phases returns the workflow's phase names in order.
func (w *Workflow[S]) Phases() []string {
	names := make([]string, len(w.steps))
	for i, s := range w.steps {
		names[i] = s.name
	}
	return names
}

func (w *Workflow[S]) phaseSteps() []step { return w.steps }

func (w *Workflow[S]) initialState(req *Request) ([]byte, error) {
	s, err := w.start(req)
	if err != nil {
		return nil, err
	}
	return json.Marshal(&s)
}

// AnyWorkflow is implemented by every *Workflow, whatever its state type, so
// a Runner can hold workflows of different types. Only this package
// implements it.
type AnyWorkflow interface {
	Name() string
	phaseSteps() []step
	initialState(req *Request) ([]byte, error)
	resumeAt(recoveryPoint, next string) (int, error)
}

func makeStep[S any](p Phase[S], iso pgx.TxIsoLevel) step {
	st := step{name: p.name, isolation: iso, jumps: p.jumps}
	if p.call != nil {
		call := p.call
		st.call = func(ctx context.Context, fc *ForeignCall, raw []byte) ([]byte, error) {
			var s S
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("decode state: %w", err)
			}
			if err := call(ctx, fc, &s); err != nil {
				return nil, err
			}
			return json.Marshal(&s)
		}
	}
	if p.local != nil {
		local := p.local
		st.local = func(ctx context.Context, tx pgx.Tx, raw []byte) ([]byte, Outcome, error) {
			var s S
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, Outcome{}, fmt.Errorf("decode state: %w", err)
			}
			out, err := local(ctx, tx, &s)
			if err != nil {
				return nil, Outcome{}, err
			}
			b, err := json.Marshal(&s)
			return b, out, err
		}
	}
	return st
}

func decodeParams[S any](req *Request) (S, error) {
	var s S
	if len(req.Params) == 0 {
		return s, nil
	}
	err := json.Unmarshal(req.Params, &s)
	return s, err
}

func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(name) > maxNameLength {
		return fmt.Errorf("%s %q is longer than %d bytes", what, name, maxNameLength)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%s %q must be printable ASCII without spaces", what, name)
		}
	}
	return nil
}
