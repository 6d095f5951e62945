package apui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// The actions on keys, shared by the pages' forms and the JSON API: resume
// (unpark, then run the key's phases at once when this process registered
// its workflow, else leave it to the sweep), unpark, forget, and resolve
// (record the operator's verdict on an unknown outcome). Each is one of the
// Runner's operator methods; the bulk versions apply one to every key a
// filter selects, at most Options.BulkLimit of them, after a dry run.

// actionNames are the single-key actions, and bulkActions those that may be
// applied over a filter.
var (
	actionNames = []string{"resume", "unpark", "forget", "resolve"}
	bulkActions = []string{"resume", "unpark", "forget"}
)

// keyAction is one action on one key, as a form or the API asks for it.
type keyAction struct {
	Action string `json:"-"`
	Scope  string `json:"scope"`
	Key    string `json:"key"`
	// Happened is the verdict of a resolve: whether the call took effect.
	Happened *bool `json:"happened,omitempty"`
	// Note says how the operator knows; it is recorded with the verdict.
	Note string `json:"note,omitempty"`
	// Result is the call's result, as JSON, with a verdict of happened: the
	// phase's reconcile function reads it (ForeignCall.OperatorResult).
	Result json.RawMessage `json:"result,omitempty"`
}

// maxResult bounds a verdict's result, which the audit entry carries
// with the rest of its detail (atomicphase.MaxAuditDetail).
const maxResult = atomicphase.MaxAuditDetail / 2

// errBadAction is an action that cannot be taken as asked.
type errBadAction struct{ msg string }

func (e *errBadAction) Error() string { return e.msg }

// do takes the action and records it in the key's audit trail, with who
// and detail (a bulk action's filter, say); done names what happened
// ("resumed", "scheduled", "unparked", "forgotten", "resolved"). An action
// refused records nothing.
func (h *Handler) do(ctx context.Context, actor string, a *keyAction, detail map[string]any) (done string, err error) {
	done, err = h.act(ctx, actor, a)
	if err != nil && done == "" {
		return "", err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["done"] = done
	if a.Happened != nil {
		detail["happened"] = *a.Happened
	}
	if len(a.Result) > 0 {
		detail["result"] = a.Result
	}
	if err != nil {
		detail["error"] = auditError(err)
	}
	raw, jerr := json.Marshal(detail)
	if jerr != nil {
		return done, jerr
	}
	aerr := h.opts.Runner.RecordAudit(ctx, &atomicphase.AuditEntry{Scope: a.Scope, Key: a.Key, Actor: actor,
		Action: a.Action, Note: strings.TrimSpace(a.Note), Detail: raw})
	if err == nil && aerr != nil {
		err = fmt.Errorf("%s, but recording it in the audit trail failed: %w", done, aerr)
	}
	return done, err
}

// act takes the action. An error with done set means the action was
// taken in part (a resume that unparked the key, then failed to run it).
func (h *Handler) act(ctx context.Context, actor string, a *keyAction) (done string, err error) {
	if a.Key == "" {
		return "", &errBadAction{"an action needs the key's scope and key"}
	}
	// The audit trail keeps the note and the result for
	// SweepConfig.AuditRetention: neither may grow it without bound.
	if n := len(strings.TrimSpace(a.Note)); n > atomicphase.MaxAuditNote {
		return "", &errBadAction{fmt.Sprintf("the note is %d bytes; the most is %d: say how you know in fewer words, and where the rest is", n, atomicphase.MaxAuditNote)}
	}
	if n := len(a.Result); n > maxResult {
		return "", &errBadAction{fmt.Sprintf("the result is %d bytes; the most is %d: give the downstream's reference, not its whole answer", n, maxResult)}
	}
	rn := h.opts.Runner
	switch a.Action {
	case "resume":
		before, err := rn.Inspect(ctx, a.Scope, a.Key)
		if err != nil {
			return "", err
		}
		if before.Status == atomicphase.KeyFinished {
			return "", atomicphase.ErrKeyFinished
		}
		// A parked key is unparked (a fresh budget of attempts); any other
		// is made due, its attempts as they are.
		due := rn.MakeDue
		if before.Status == atomicphase.KeyParked {
			due = rn.Unpark
		}
		if err := due(ctx, a.Scope, a.Key); err != nil {
			return "", err
		}
		if _, ok := rn.WorkflowPhases(before.Workflow); !ok {
			return "scheduled", nil
		}
		if _, err := rn.Resume(ctx, a.Scope, a.Key); err != nil {
			return "scheduled", &resumeFailed{err}
		}
		return "resumed", nil
	case "unpark":
		return done2("unparked", rn.Unpark(ctx, a.Scope, a.Key))
	case "forget":
		return done2("forgotten", rn.Forget(ctx, a.Scope, a.Key))
	case "resolve":
		if a.Happened == nil {
			return "", &errBadAction{"resolve needs a verdict: happened true or false"}
		}
		note := strings.TrimSpace(a.Note)
		if note == "" {
			return "", &errBadAction{"resolve needs a note saying how you know (who at the downstream, which record)"}
		}
		if len(a.Result) > 0 {
			if !*a.Happened {
				return "", &errBadAction{"a call that did not happen has no result: leave the result empty"}
			}
			if !json.Valid(a.Result) {
				return "", &errBadAction{`the result is not JSON: quote a string ("ref-123") or give an object ({"id": "ref-123"})`}
			}
			return done2("resolved", rn.RecordResolutionWithResult(ctx, a.Scope, a.Key, actor+": "+note, a.Result))
		}
		return done2("resolved", rn.RecordResolution(ctx, a.Scope, a.Key, *a.Happened, actor+": "+note))
	}
	return "", &errBadAction{fmt.Sprintf("no action %q; use one of %s", a.Action, strings.Join(actionNames, ", "))}
}

// resumeFailed is a resume that made the key due (unparking it), but
// whose run of the key's phases failed.
type resumeFailed struct{ err error }

const resumeFailedText = "the key is due for the sweep (unparked, if it was parked), but resuming it now failed: "

func (e *resumeFailed) Error() string { return resumeFailedText + e.err.Error() }
func (e *resumeFailed) Unwrap() error { return e.err }

// done2 is done when err is nil, and "" (nothing done) otherwise.
func done2(done string, err error) (string, error) {
	if err != nil {
		return "", err
	}
	return done, nil
}

// statusOf is the HTTP status of an action's error.
func statusOf(err error) int {
	var bad *errBadAction
	switch {
	case errors.As(err, &bad):
		return http.StatusBadRequest
	case errors.Is(err, atomicphase.ErrKeyNotFound):
		return http.StatusNotFound
	case errors.Is(err, atomicphase.ErrKeyFinished), errors.Is(err, atomicphase.ErrKeyUnfinished),
		errors.Is(err, atomicphase.ErrKeyNotParked), errors.Is(err, atomicphase.ErrKeyParked), errors.Is(err, atomicphase.ErrKeyPaid),
		errors.Is(err, atomicphase.ErrInProgress), errors.Is(err, atomicphase.ErrOutcomeUnsettled):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// keyAction takes the action a key page's form posts.
func (h *Handler) keyAction(w http.ResponseWriter, r *http.Request) {
	if !h.checkCSRF(r) {
		h.fail(w, r, http.StatusForbidden, errors.New("the form's token is missing or stale: reload the page and try again"))
		return
	}
	a := &keyAction{Action: r.PostFormValue("action"), Scope: r.PostFormValue("scope"), Key: r.PostFormValue("key"),
		Note: r.PostFormValue("note")}
	if s := strings.TrimSpace(r.PostFormValue("result")); s != "" {
		a.Result = json.RawMessage(s)
	}
	switch r.PostFormValue("happened") {
	case "true":
		a.Happened = new(bool)
		*a.Happened = true
	case "false":
		a.Happened = new(bool)
	}
	done, err := h.do(r.Context(), h.opts.Actor(r), a, nil)
	if err != nil {
		h.fail(w, r, statusOf(err), fmt.Errorf("%s %q in scope %q: %s", a.Action, escapeControl(a.Key), escapeControl(a.Scope),
			h.actionError(a.Scope, a.Key, err)))
		return
	}
	if done == "forgotten" {
		http.Redirect(w, r, h.listURL(url.Values{"done": {done}}), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, h.keyURL(a.Scope, a.Key)+"&done="+done, http.StatusSeeOther)
}

// bulkResult is what a bulk action did, or (a dry run) would do.
type bulkResult struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Selected counts the keys the filter selects, up to Limit; More says
	// it selects more, of which only the oldest Limit are acted on.
	Selected int  `json:"selected"`
	More     bool `json:"more"`
	Limit    int  `json:"limit"`
	// Unsettled counts, for a forget, the selected keys whose call's
	// outcome is unknown or whose call may be in flight: the forget skips
	// them (atomicphase.ErrOutcomeUnsettled), and the dry run says so.
	Unsettled int `json:"unsettled"`
	// Paid counts, for a forget, the selected finished keys that may have
	// made a foreign call (KeyInfo.Paid; every finished key, for a console
	// that has not registered the key's workflow version): the forget
	// skips them too (atomicphase.ErrKeyPaid).
	Paid int `json:"paid"`
	// Sample are the first keys selected (a dry run shows them).
	Sample []*atomicphase.KeyInfo `json:"sample"`
	// Done and Failed count the keys changed and those the action refused
	// (a key finished or taken since the dry run, say); Failures say why
	// for the first few.
	Done     int      `json:"done"`
	Failed   int      `json:"failed"`
	Failures []string `json:"failures,omitempty"`
}

// bulkDo runs (or, dryRun, counts) action over the keys f selects.
func (h *Handler) bulkDo(ctx context.Context, actor, action string, f *atomicphase.KeyPageFilter, dryRun bool) (*bulkResult, error) {
	if !contains(bulkActions, action) {
		return nil, &errBadAction{fmt.Sprintf("no bulk action %q; use one of %s", action, strings.Join(bulkActions, ", "))}
	}
	if !isFiltered(f) {
		return nil, &errBadAction{"a bulk action needs a filter (status, workflow, scope, age, error or key): it never applies to every key at once"}
	}
	f.Limit, f.After = h.opts.BulkLimit, nil
	pg, err := h.listKeys(ctx, f)
	if err != nil {
		return nil, err
	}
	res := &bulkResult{Action: action, DryRun: dryRun, Selected: len(pg.Keys), More: pg.Next != nil, Limit: h.opts.BulkLimit}
	filter := map[string]string{}
	for k, v := range filterValues(f) {
		filter[k] = v[0]
	}
	for i, k := range pg.Keys {
		if action == "forget" && k.Unsettled {
			res.Unsettled++
		}
		if action == "forget" && k.Paid {
			res.Paid++
		}
		if i < 10 {
			res.Sample = append(res.Sample, h.redacted(k))
		}
		if dryRun {
			continue
		}
		a := &keyAction{Action: action, Scope: k.Scope, Key: k.Key, Note: "bulk " + action}
		if _, err := h.do(ctx, actor, a, map[string]any{"bulk_filter": filter}); err != nil {
			res.Failed++
			if len(res.Failures) < 10 {
				res.Failures = append(res.Failures, fmt.Sprintf("%s %s: %s", escapeControl(k.Scope), escapeControl(k.Key),
					escapeControl(h.actionError(k.Scope, k.Key, err))))
			}
			continue
		}
		res.Done++
	}
	return res, nil
}

// bulkData is the bulk page's: the result, and the filter to confirm with.
type bulkData struct {
	Result  *bulkResult
	Hidden  url.Values
	BackURL string
}

// bulk runs a bulk action the key list's form posts: a dry run first,
// which shows the count and a sample and a form to confirm; the
// confirmation then acts.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request) {
	if !h.checkCSRF(r) {
		h.fail(w, r, http.StatusForbidden, errors.New("the form's token is missing or stale: reload the page and try again"))
		return
	}
	f, err := h.parseFilter(r.PostForm)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	dryRun := r.PostFormValue("confirm") != "yes"
	res, err := h.bulkDo(r.Context(), h.opts.Actor(r), r.PostFormValue("action"), f, dryRun)
	if err != nil {
		h.fail(w, r, statusOf(err), err)
		return
	}
	title := "Bulk " + res.Action
	if dryRun {
		title += ": dry run"
	}
	h.render(w, r, http.StatusOK, "bulk", &page{Title: title,
		Data: &bulkData{Result: res, Hidden: filterValues(f), BackURL: h.listURL(filterValues(f))}})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
