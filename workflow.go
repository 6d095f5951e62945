package atomicphase

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/jackc/pgx/v5"
)

// maxNameLength keeps names readable in logs and indexes alike.
const maxNameLength = 63

// StartFunc builds a workflow's initial state from the request's input: in is
// the request's JSON parameters decoded into the workflow's input type In
// (see NewWorkflow), req the request itself (its scope, say). It runs before
// anything is written and on every attempt, so it must be a pure function of
// its arguments; an error rejects the request with ErrInvalidRequest and
// stores nothing, so a corrected request may reuse the key. Validate the
// input here.
type StartFunc[In, S any] func(in In, req *Request) (S, error)

// WorkflowOpts are optional settings of a Workflow. A nil *WorkflowOpts means
// all defaults.
type WorkflowOpts struct {
	// Isolation is the transaction isolation level of the workflow's
	// phases; a phase's WithIsolation overrides it. Defaults to PostgreSQL's
	// READ COMMITTED.
	Isolation pgx.TxIsoLevel

	// KeepFinishedState keeps the state on the key row once the workflow
	// has responded. A finished key needs only its response to replay, so by
	// default the state (which may hold card tokens or personal data) is
	// cleared in the same commit that stores the response. Defaults to false.
	KeepFinishedState bool

	// CommitEachPhase gives every phase a transaction and a commit of its
	// own, and records a new key in a transaction of its own, instead of
	// fusing consecutive local phases into one transaction (see Workflow).
	// It costs a commit per phase; it suits a workflow whose local phases
	// are long, where a retry should not redo the ones that finished.
	// Defaults to false.
	CommitEachPhase bool

	// ReplayHeaders names the per-client response headers this workflow's
	// responses may store and replay (see docs/security-and-limits.md):
	// Set-Cookie, Authorization, WWW-Authenticate and the like are refused
	// by default, since a replay hands them to whoever sends the key.
	// Hop-by-hop headers (Connection, Transfer-Encoding, …) and the ones
	// net/http computes (Content-Length, Date) can never be named. Defaults
	// to none.
	ReplayHeaders []string

	// AssumeNewKeys is ignored. Every request not marked as a retry
	// (Request.Retry) is now sent as this option sent a request: its key
	// read at the head of its first unit's batch, ahead of its recording.
	//
	// Deprecated: mark retries with Request.Retry (aphttp's Client and
	// Handler do) instead.
	AssumeNewKeys bool

	// Version names this definition of the workflow: each key records the
	// version it started under and resumes under that version's
	// definition, in whichever process registered it. Defaults to one
	// derived from the phase list (see Workflow.Version): a phase added,
	// removed, reordered or changed in kind is a new version; a phase
	// renamed with WithFormerNames is not. Declare one to control it (a
	// version string that changes when the definition does).
	Version string
}

// Workflow is a named, validated, ordered list of phases over a state of type
// S. Its name is stored on every key it runs, so any process that registered
// it can resume the key. Build one with NewWorkflow.
type Workflow[S any] struct {
	name      string
	start     func(req *Request) ([]byte, error)
	steps     []step
	byName    map[string]int
	keepState bool
	// replayHeaders are the per-client headers ReplayHeaders allows,
	// canonicalised.
	replayHeaders map[string]bool
	// def is the workflow's definition, described once (see definition).
	def []string
	// version is the definition's version (WorkflowOpts.Version, or
	// derived), and phaseNames its phases' names, former names included.
	version string
	// nameArg and versionArg are name and version boxed once, for the
	// statements that store them (keystore.KeyArgs).
	nameArg, versionArg any
	phaseNames          []string
	// shapeHash is the derived version, whether or not one was declared:
	// two definitions that share a declared version must share it.
	shapeHash string
}

// step is the state-type-free view of a phase that the Runner executes:
// states travel between phases as JSON bytes, stored verbatim.
type step struct {
	name string
	// nameArg is name boxed once, for the statements that store it.
	nameArg any
	// downstreamName names the phase in its downstream keys: its oldest
	// name, so that renaming a foreign phase keeps the keys of calls made
	// under an earlier name.
	downstreamName string
	isolation      pgx.TxIsoLevel
	// call is nil for local phases.
	call func(ctx context.Context, fc *ForeignCall, state []byte) ([]byte, error)
	// reconcile is set for a foreign phase whose downstream has no
	// idempotency keys (WithReconcile).
	reconcile func(ctx context.Context, fc *ForeignCall, state []byte) (bool, []byte, error)
	// local is nil for a foreign phase that records nothing of its own.
	local func(ctx context.Context, tx Tx, state []byte) ([]byte, Outcome, error)
	jumps []string
	// formerNames are the names the phase had before (WithFormerNames).
	formerNames []string
	// alone: the phase commits on its own (WorkflowOpts.CommitEachPhase).
	alone bool
	// fkRetries is how many of the key's attempts take a foreign-key
	// violation in the phase for a transient race
	// (Phase.WithForeignKeyRetries).
	fkRetries int
}

// NewWorkflow validates phases and builds a Workflow whose requests carry an
// input of type In and whose phases share a state of type S.
//
// What the client sends and what the phases compute are kept apart: a
// request's JSON parameters are decoded into In (strictly: member names must
// match field names exactly, case included; other members are allowed), and
// start builds the initial S from it. A request body therefore can never set
// a field a phase is meant to compute. A workflow that takes no input uses
// struct{} as In.
//
// NewWorkflow reports every problem it finds: an empty name or phase list, a
// nil start, duplicate or reserved phase names (former names included), a
// phase without a function, and jumps to phases that do not exist or do not
// come later.
func NewWorkflow[In, S any](name string, start StartFunc[In, S], phases []Phase[S], opts *WorkflowOpts) (*Workflow[S], error) {
	if opts == nil {
		opts = &WorkflowOpts{}
	}
	wf := &Workflow[S]{name: name, byName: make(map[string]int, len(phases)), keepState: opts.KeepFinishedState}

	var errs []error
	if err := checkName("workflow name", name); err != nil {
		errs = append(errs, err)
	}
	var err error
	if wf.replayHeaders, err = allowedHeaders(opts.ReplayHeaders); err != nil {
		errs = append(errs, err)
	}
	if start == nil {
		errs = append(errs, errors.New("the start function is nil; pass one that builds the initial state from the input"))
	} else {
		wf.start = startStep(start)
	}
	if len(phases) == 0 {
		errs = append(errs, errors.New("a workflow needs at least one phase"))
	}
	for i, p := range phases {
		for j, n := range append([]string{p.name}, p.formerNames...) {
			what := fmt.Sprintf("phase %d name", i)
			if j > 0 {
				what = fmt.Sprintf("phase %q former name", p.name)
			}
			if err := checkName(what, n); err != nil {
				errs = append(errs, err)
			} else if n == RecoveryPointStarted || n == RecoveryPointFinished {
				errs = append(errs, fmt.Errorf("%s: %q is a reserved recovery point; choose another name", what, n))
			} else if k, dup := wf.byName[n]; dup {
				errs = append(errs, fmt.Errorf("phases %d and %d both use the name %q; names, former names included, must be unique", k, i, n))
			} else {
				wf.byName[n] = i
			}
		}
		if p.local == nil && p.call == nil {
			errs = append(errs, fmt.Errorf("phase %q has no function", p.name))
		}
		if p.fkRetries < 0 {
			errs = append(errs, fmt.Errorf("phase %q: WithForeignKeyRetries(%d): the number of attempts must not be negative", p.name, p.fkRetries))
		}
		if p.reconcile != nil && p.call == nil {
			errs = append(errs, fmt.Errorf("phase %q has a reconcile function but makes no foreign call; WithReconcile is for foreign phases", p.name))
		}
		iso := p.isolation
		if iso == "" {
			iso = opts.Isolation
		}
		st := makeStep(p, iso)
		st.alone = opts.CommitEachPhase
		st.fkRetries = p.fkRetries
		wf.steps = append(wf.steps, st)
	}
	for i, p := range phases {
		for _, target := range p.jumps {
			j, ok := wf.byName[target]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("phase %q jumps to %q, which does not exist", p.name, target))
			case j <= i:
				errs = append(errs, fmt.Errorf("phase %q jumps back to %q; jumps must go forward so the workflow ends", p.name, target))
			case target != phases[j].name:
				errs = append(errs, fmt.Errorf("phase %q jumps to %q, a former name; jump to %q", p.name, target, phases[j].name))
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("atomicphase: workflow %q is invalid: %w", name, errors.Join(errs...))
	}
	wf.def = wf.describe()
	wf.shapeHash = wf.derivedVersion()
	wf.version = opts.Version
	if wf.version == "" {
		wf.version = wf.shapeHash
	} else if err := checkName("workflow version", wf.version); err != nil {
		return nil, fmt.Errorf("atomicphase: workflow %q is invalid: %w", name, err)
	}
	wf.nameArg, wf.versionArg = wf.name, wf.version
	for _, st := range wf.steps {
		wf.phaseNames = append(append(wf.phaseNames, st.name), st.formerNames...)
	}
	return wf, nil
}

// Version returns the version of the workflow's definition that its new
// keys record: WorkflowOpts.Version, or one derived from the phase list —
// each phase by its oldest name (so a rename declared with WithFormerNames
// keeps the version), its kind (local, foreign, foreign reconciled) and its
// jumps, in order. Keys resume under the definition of their own version;
// a deploy that changes the phase list registers the old definition beside
// the new one until `atomicphase versions` shows the old one drained.
func (w *Workflow[S]) Version() string { return w.version }

// derivedVersion hashes what of the phase list a key's progress depends on.
func (w *Workflow[S]) derivedVersion() string {
	identity := func(name string) string { return w.steps[w.byName[name]].downstreamName }
	h := sha256.New()
	for _, st := range w.steps {
		kind := "local"
		switch {
		case st.call != nil && st.reconcile != nil:
			kind = "foreign-reconciled"
		case st.call != nil:
			kind = "foreign"
		}
		jumps := make([]string, len(st.jumps))
		for i, j := range st.jumps {
			jumps[i] = identity(j)
		}
		fmt.Fprintf(h, "%q %s %q\n", st.downstreamName, kind, jumps)
	}
	return "v" + hex.EncodeToString(h.Sum(nil))[:10]
}

// MustWorkflow is like NewWorkflow but panics if the workflow is invalid. It
// is meant for package-level declarations whose validity is fixed at compile
// time.
func MustWorkflow[In, S any](name string, start StartFunc[In, S], phases []Phase[S], opts *WorkflowOpts) *Workflow[S] {
	wf, err := NewWorkflow(name, start, phases, opts)
	if err != nil {
		panic(err)
	}
	return wf
}

// Name returns the workflow's name.
func (w *Workflow[S]) Name() string { return w.name }

func (w *Workflow[S]) boxedNames() (name, version any) { return w.nameArg, w.versionArg }

// Phases returns the workflow's phase names in order.
func (w *Workflow[S]) Phases() []string {
	names := make([]string, len(w.steps))
	for i, s := range w.steps {
		names[i] = s.name
	}
	return names
}

func (w *Workflow[S]) isNil() bool                               { return w == nil }
func (w *Workflow[S]) phaseList() []string                       { return w.phaseNames }
func (w *Workflow[S]) shape() string                             { return w.shapeHash }
func (w *Workflow[S]) phaseSteps() []step                        { return w.steps }
func (w *Workflow[S]) keepsFinishedState() bool                  { return w.keepState }
func (w *Workflow[S]) replayable() map[string]bool               { return w.replayHeaders }
func (w *Workflow[S]) initialState(req *Request) ([]byte, error) { return w.start(req) }

// AnyWorkflow is implemented by every *Workflow, whatever its state type, so
// a Runner can hold workflows of different types. Only this package
// implements it.
type AnyWorkflow interface {
	Name() string
	isNil() bool
	phaseSteps() []step
	initialState(req *Request) ([]byte, error)
	keepsFinishedState() bool
	replayable() map[string]bool
	definition() []string
	resumeAt(recoveryPoint, jumpTarget string) (int, error)
	// Version is the version of the definition (Workflow.Version).
	Version() string
	// boxedNames returns Name and Version boxed once.
	boxedNames() (name, version any)
	phaseList() []string
	shape() string
}

// startStep decodes a request's parameters into In, strictly, runs start and
// encodes the state it returns.
func startStep[In, S any](start StartFunc[In, S]) func(req *Request) ([]byte, error) {
	return func(req *Request) ([]byte, error) {
		var in In
		if err := decodeInput(req.Params, &in); err != nil {
			return nil, err
		}
		s, err := start(in, req)
		if err != nil {
			return nil, err
		}
		return json.Marshal(&s)
	}
}

func makeStep[S any](p Phase[S], iso pgx.TxIsoLevel) step {
	st := step{name: p.name, nameArg: p.name, downstreamName: p.name, isolation: iso, jumps: p.jumps, formerNames: p.formerNames}
	if len(p.formerNames) > 0 {
		st.downstreamName = p.formerNames[0]
	}
	if p.call != nil {
		call := p.call
		st.call = func(ctx context.Context, fc *ForeignCall, raw []byte) ([]byte, error) {
			var s S
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, Permanent(fmt.Errorf("decode state: %w", err))
			}
			if err := call(ctx, fc, &s); err != nil {
				return nil, err
			}
			return encodeState(&s)
		}
	}
	if p.reconcile != nil {
		reconcile := p.reconcile
		st.reconcile = func(ctx context.Context, fc *ForeignCall, raw []byte) (bool, []byte, error) {
			var s S
			if err := json.Unmarshal(raw, &s); err != nil {
				return false, nil, Permanent(fmt.Errorf("decode state: %w", err))
			}
			happened, err := reconcile(ctx, fc, &s)
			if err != nil || !happened {
				return false, nil, err
			}
			b, err := encodeState(&s)
			return true, b, err
		}
	}
	if p.local != nil {
		local := p.local
		st.local = func(ctx context.Context, tx Tx, raw []byte) ([]byte, Outcome, error) {
			var s S
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, Outcome{}, Permanent(fmt.Errorf("decode state: %w", err))
			}
			out, err := local(ctx, tx, &s)
			if err != nil {
				return nil, Outcome{}, err
			}
			b, err := encodeState(&s)
			return b, out, err
		}
	}
	return st
}

// encodeState encodes a phase's state for the next phase and the store. A
// state that does not encode fails the same way every time: permanently.
func encodeState[S any](s *S) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, Permanent(fmt.Errorf("encode state: %w", err))
	}
	return b, nil
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

// definition describes what of the workflow a stored key depends on, one
// line per part: its state type, each phase's name, former names, kind,
// isolation, jumps and commit, and the options that change what is
// stored. Two workflows with one definition run a key the same way
// (their functions are not compared: they cannot be), so Register accepts
// the second as the first.
func (w *Workflow[S]) definition() []string { return w.def }

// describe builds the workflow's definition.
func (w *Workflow[S]) describe() []string {
	lines := []string{
		"state type " + reflect.TypeFor[S]().String(),
		fmt.Sprintf("%d phases", len(w.steps)),
	}
	for i, st := range w.steps {
		kind := "local"
		switch {
		case st.call != nil && st.reconcile != nil:
			kind = "foreign, reconciled"
		case st.call != nil:
			kind = "foreign"
		}
		iso := string(st.isolation)
		if iso == "" {
			iso = "default isolation"
		}
		lines = append(lines, fmt.Sprintf("phase %d %q (%s, %s, former names %q, jumps %q, own commit %t)",
			i, st.name, kind, iso, st.formerNames, st.jumps, st.alone))
	}
	headers := make([]string, 0, len(w.replayHeaders))
	for h := range w.replayHeaders {
		headers = append(headers, h)
	}
	slices.Sort(headers)
	return append(lines, fmt.Sprintf("KeepFinishedState %t", w.keepState), fmt.Sprintf("ReplayHeaders %q", headers))
}

// definitionDiff names the first part where two definitions differ, or ""
// when they are the same.
func definitionDiff(have, want []string) string {
	for i := range max(len(have), len(want)) {
		switch {
		case i >= len(have):
			return fmt.Sprintf("this one adds %s", want[i])
		case i >= len(want):
			return fmt.Sprintf("the registered one also has %s", have[i])
		case have[i] != want[i]:
			return fmt.Sprintf("the registered one has %s, this one %s", have[i], want[i])
		}
	}
	return ""
}
