package apui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/atomicphase/atomicphase"
)

//go:embed templates/*.html static/*
var assets embed.FS

// statuses are the key statuses in the order the pages show them.
var statuses = atomicphase.KeyStatuses()

// parseTemplates parses each page with the layout it shares.
func (h *Handler) parseTemplates() error {
	funcs := template.FuncMap{
		"prefix":         func() string { return h.opts.Prefix },
		"readOnly":       func() bool { return h.opts.ReadOnly },
		"errorFilter":    func() bool { return !h.errorsRedacted() },
		"ago":            ago,
		"when":           when,
		"keyURL":         h.keyURL,
		"escape":         escapeControl,
		"shellWord":      shellWord,
		"shellArgs":      shellArgs,
		"errorLines":     errorLines,
		"showJSON":       showJSON,
		"showBody":       showBody,
		"hex":            func(b []byte) string { return fmt.Sprintf("%x", b) },
		"statuses":       func() []atomicphase.KeyStatus { return statuses },
		"listURL":        h.listURL,
		"half":           half,
		"workflowFilter": func(w string) url.Values { return url.Values{"workflow": {w}} },
		"deref":          func(p *string) string { return derefString(p) },
		"derefBool":      func(p *bool) bool { return p != nil && *p },
		"unfinished":     func(k *atomicphase.KeyInfo) bool { return k.Status != atomicphase.KeyFinished },
		"forgettable": func(k *atomicphase.KeyInfo) bool {
			return k.Status == atomicphase.KeyFinished || k.Status == atomicphase.KeyParked
		},
	}
	h.pages = map[string]*template.Template{}
	for _, page := range []string{"overview", "keys", "key", "bulk", "versions", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return fmt.Errorf("apui: template %s: %w", page, err)
		}
		h.pages[page] = t
	}
	return nil
}

// page is what every page's layout shows.
type page struct {
	Title string
	CSRF  string
	// Notice is a line on what the last action did; Problem one on what
	// went wrong.
	Notice, Problem string
	Data            any
}

// render writes a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	p.CSRF = h.csrfToken(w, r)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := h.pages[name].Execute(w, p); err != nil {
		slog.ErrorContext(r.Context(), "apui: rendering a page failed", "page", name, "error", err)
	}
}

// fail renders the error page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	h.render(w, r, status, "error", &page{Title: http.StatusText(status), Problem: err.Error()})
}

// overviewData is the overview page's.
type overviewData struct {
	Workflows      []workflowLevels
	Totals         map[atomicphase.KeyStatus]int64
	Unfinished     int64
	Estimate       int64
	Oldest         *atomicphase.KeyLevel
	Trouble        []*atomicphase.KeyInfo
	Took           time.Duration
	FinishedApprox int64
	// Chart is the levels over the last hour, as this process sampled
	// them; nil before it has two samples.
	Chart *levelChart
	// StatusLinks and WorkflowLinks filter the key list.
	StatusLinks   map[atomicphase.KeyStatus]url.Values
	WorkflowLinks map[string]url.Values
}

// workflowLevels are one workflow's row of the levels table.
type workflowLevels struct {
	Workflow string
	Counts   map[atomicphase.KeyStatus]int64
	Oldest   time.Time
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d, err := h.overviewData(r)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.Took = time.Since(start)
	h.render(w, r, http.StatusOK, "overview", &page{Title: "Overview", Data: d})
}

func (h *Handler) overviewData(r *http.Request) (*overviewData, error) {
	ctx := r.Context()
	rn := h.opts.Runner
	levels, err := rn.KeyLevels(ctx, nil)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	h.samples.add(sampleOf(now, levels))
	d := &overviewData{Totals: map[atomicphase.KeyStatus]int64{}, StatusLinks: map[atomicphase.KeyStatus]url.Values{},
		WorkflowLinks: map[string]url.Values{}}
	for _, s := range statuses {
		d.StatusLinks[s] = url.Values{"status": {string(s)}}
	}
	byName := map[string]*workflowLevels{}
	for i, l := range levels {
		wl := byName[l.Workflow]
		if wl == nil {
			wl = &workflowLevels{Workflow: l.Workflow, Counts: map[atomicphase.KeyStatus]int64{}, Oldest: l.Oldest}
			byName[l.Workflow] = wl
			d.WorkflowLinks[l.Workflow] = url.Values{"workflow": {l.Workflow}}
		}
		wl.Counts[l.Status] += l.Count
		wl.Oldest = minTime(wl.Oldest, l.Oldest)
		d.Totals[l.Status] += l.Count
		d.Unfinished += l.Count
		if d.Oldest == nil || l.Oldest.Before(d.Oldest.Oldest) {
			d.Oldest = &levels[i]
		}
	}
	for _, wl := range byName {
		d.Workflows = append(d.Workflows, *wl)
	}
	slices.SortFunc(d.Workflows, func(a, b workflowLevels) int {
		if a.Workflow < b.Workflow {
			return -1
		}
		return 1
	})
	if d.Estimate, err = rn.EstimateKeys(ctx); err != nil {
		return nil, err
	}
	d.FinishedApprox = -1 // not estimated yet
	if d.Estimate >= 0 {
		d.FinishedApprox = max(d.Estimate-d.Unfinished, 0)
	}
	trouble, err := rn.RecentTrouble(ctx, nil, 10)
	if err != nil {
		return nil, err
	}
	for _, k := range trouble {
		d.Trouble = append(d.Trouble, h.redacted(k))
	}
	d.Chart = chartOf(h.samples.since(now), now)
	return d, nil
}

// keysData is the key list's.
type keysData struct {
	Filter   *atomicphase.KeyPageFilter
	Keys     []*atomicphase.KeyInfo
	NextURL  string
	Filtered bool
	Hidden   url.Values
	Took     time.Duration
}

func (h *Handler) keys(w http.ResponseWriter, r *http.Request) {
	f, err := h.parseFilter(r.URL.Query())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	// A downstream key (a webhook's reference) is looked up in its scope.
	if ref := r.URL.Query().Get("ref"); ref != "" {
		m, err := h.opts.Runner.FindDownstreamKey(r.Context(), f.Scope, ref)
		if err != nil {
			h.fail(w, r, lookupStatus(err), fmt.Errorf("downstream key %q in scope %q: %w", escapeControl(ref), escapeControl(f.Scope), err))
			return
		}
		http.Redirect(w, r, h.keyURL(m.Key.Scope, m.Key.Key), http.StatusSeeOther)
		return
	}
	// A key looked up with its scope has one page: its own.
	if f.Key != "" && f.Scope != "" && r.URL.Query().Get("list") == "" {
		http.Redirect(w, r, h.keyURL(f.Scope, f.Key), http.StatusSeeOther)
		return
	}
	start := time.Now()
	pg, err := h.listKeys(r.Context(), f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d := &keysData{Filter: f, Filtered: isFiltered(f), Hidden: filterValues(f), Took: time.Since(start)}
	for _, k := range pg.Keys {
		d.Keys = append(d.Keys, h.redacted(k))
	}
	if pg.Next != nil {
		d.NextURL = h.listURL(cursorValues(filterValues(f), pg.Next))
	}
	h.render(w, r, http.StatusOK, "keys", &page{Title: "Keys", Data: d, Notice: notice(r)})
}

// keyData is a key's page's.
type keyData struct {
	Key    *atomicphase.KeyInfo
	Phases []phaseMark
	// Registered is false when this process does not know the key's
	// workflow: resume only schedules it, and the phases are those the
	// versions registry recorded for its version (Recorded), if any.
	Registered, Recorded bool
	// Audit is a page of the key's audit trail, newest first, and
	// OlderURL the link to the next (older) page, if any.
	Audit    []*atomicphase.AuditEntry
	OlderURL string
	// History is what went wrong with the key, oldest first; NoHistory is
	// set when the database keeps none (a schema before migration 019).
	History   []*atomicphase.KeyEvent
	NoHistory bool
}

// phaseMark is a phase on a key's page: done (committed), next (where the
// next attempt starts), or to come.
type phaseMark struct {
	Name      string
	Done      bool
	Next      bool
	Recovered bool // the recovery point: the last committed phase
}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	if key == "" {
		h.fail(w, r, http.StatusBadRequest, errors.New("a key's page needs its scope and key: /key?scope=...&key=..."))
		return
	}
	k, err := h.opts.Runner.Inspect(r.Context(), scope, key)
	if errors.Is(err, atomicphase.ErrKeyNotFound) {
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no key %q in scope %q (forgotten, reaped, or never recorded)", escapeControl(key), escapeControl(scope)))
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d := &keyData{}
	if k, err = h.keyPhases(r.Context(), d, k); err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.Key = h.redacted(k)
	before, _, err := auditPaging(r.URL.Query())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	var next *int64
	if d.Audit, next, err = h.auditPage(r.Context(), scope, key, before, auditPageSize); err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if next != nil {
		d.OlderURL = h.keyURL(scope, key) + "&" + url.Values{"before": {strconv.FormatInt(*next, 10)}}.Encode() + "#audit"
	}
	d.History, err = h.history(r.Context(), scope, key)
	switch {
	case errors.Is(err, atomicphase.ErrSchemaMissing):
		d.NoHistory = true
	case err != nil:
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	h.render(w, r, http.StatusOK, "key", &page{Title: "Key " + escapeControl(key), Data: d, Notice: notice(r)})
}

// keyPhases sets d's phases: those of the key's own version of its
// workflow (each key resumes under the definition it started under),
// marked against its recovery point. A process that has not registered
// the version (atomicphase ui) shows the phases the versions registry
// recorded for it, and the downstream key each recorded name would send:
// the registry does not say which phases are foreign. It returns the key,
// read again with those downstream keys when it needs them.
func (h *Handler) keyPhases(ctx context.Context, d *keyData, k *atomicphase.KeyInfo) (*atomicphase.KeyInfo, error) {
	rn := h.opts.Runner
	names, ok := rn.WorkflowVersionPhases(k.Workflow, k.WorkflowVersion)
	if ok {
		d.Phases, d.Registered = phaseMarks(names, k, true), true
		return k, nil
	}
	names, ok, err := rn.RecordedVersionPhases(ctx, k.Workflow, k.WorkflowVersion)
	if err != nil || !ok {
		return k, err
	}
	// The recorded list holds former names after their phase: which name
	// comes next is not known.
	d.Phases, d.Recorded = phaseMarks(names, k, false), true
	withKeys, err := rn.InspectWithPhases(ctx, k.Scope, k.Key, names...)
	if errors.Is(err, atomicphase.ErrKeyNotFound) {
		return k, nil // forgotten since: the page shows what was read
	}
	return withKeys, err
}

// phaseMarks marks names against k's recovery point, and the phase after
// it as next when next is set.
func phaseMarks(names []string, k *atomicphase.KeyInfo, next bool) []phaseMark {
	done := -1
	switch k.RecoveryPoint {
	case atomicphase.RecoveryPointStarted:
	case atomicphase.RecoveryPointFinished:
		done = len(names) - 1
	default:
		done = slices.Index(names, k.RecoveryPoint)
	}
	marks := make([]phaseMark, len(names))
	for i, n := range names {
		marks[i] = phaseMark{Name: n, Done: i <= done, Recovered: i == done && k.Status != atomicphase.KeyFinished,
			Next: next && i == done+1 && k.Status != atomicphase.KeyFinished}
	}
	return marks
}

// lookupStatus is the HTTP status of a failed downstream key lookup.
func lookupStatus(err error) int {
	if errors.Is(err, atomicphase.ErrDownstreamKeyNotFound) {
		return http.StatusNotFound
	}
	if errors.Is(err, atomicphase.ErrStoreUnavailable) {
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}

// keyURL is the link to a key's page.
func (h *Handler) keyURL(scope, key string) string {
	return h.opts.Prefix + "/key?" + url.Values{"scope": {scope}, "key": {key}}.Encode()
}

// listURL is the link to the key list under v.
func (h *Handler) listURL(v url.Values) string {
	if len(v) == 0 {
		return h.opts.Prefix + "/keys"
	}
	return h.opts.Prefix + "/keys?" + v.Encode()
}

// notices are what the pages say after an action redirected to them.
var notices = map[string]string{
	"resumed":   "Resumed: the key's phases ran in this process.",
	"scheduled": "Scheduled: the next sweep of a process that registered the key's workflow resumes it.",
	"unparked":  "Unparked: the next sweep resumes the key.",
	"forgotten": "Forgotten: the key and its stored response are deleted.",
	"resolved":  "Verdict recorded: the next attempt takes it instead of asking the downstream.",
}

// notice is the line the action that redirected here asks for.
func notice(r *http.Request) string { return notices[r.URL.Query().Get("done")] }

// ago says how long ago t was, to the second.
func ago(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	if d < 0 {
		return "now"
	}
	return d.String() + " ago"
}

// when writes a time for the pages: UTC, to the second.
func when(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// history is a key's history, oldest first, its errors as the console may
// show them (errorText).
func (h *Handler) history(ctx context.Context, scope, key string) ([]*atomicphase.KeyEvent, error) {
	events, err := h.opts.Runner.KeyHistory(ctx, scope, key, 0)
	for _, e := range events {
		if e.Error != nil {
			msg := h.errorText(scope, key, *e.Error)
			e.Error = &msg
		}
	}
	return events, err
}
