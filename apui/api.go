package apui

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"time"

	"github.com/atomicphase/atomicphase"
)

// The JSON admin API: the console's reads and actions for scripts
// (docs/console.md lists them). Reads are GETs with the key list's query
// parameters; actions are POSTs of an application/json body, which a
// cross-site page cannot send without a CORS preflight this handler never
// answers: no token is needed. Errors are {"error": "..."} with the HTTP
// status of the problem.

// apiKeyJSON is a key as the API serves it: KeyInfo as encoding/json
// writes it (State and the response body base64, as []byte fields are).
type apiKeyJSON = atomicphase.KeyInfo

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing to tell it
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// levelsJSON is GET api/levels's answer.
type levelsJSON struct {
	Levels []atomicphase.KeyLevel `json:"levels"`
	// Estimate is the planner's estimate of all keys, finished included;
	// -1 before the key table's first ANALYZE.
	Estimate int64                  `json:"estimate"`
	Trouble  []*atomicphase.KeyInfo `json:"recent_trouble"`
}

func (h *Handler) apiLevels(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	f := &atomicphase.LevelFilter{Workflow: r.URL.Query().Get("workflow"), Scope: r.URL.Query().Get("scope")}
	levels, err := h.opts.Runner.KeyLevels(ctx, f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if f.Workflow == "" && f.Scope == "" {
		h.samples.add(sampleOf(time.Now(), levels))
	}
	est, err := h.opts.Runner.EstimateKeys(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	trouble, err := h.opts.Runner.RecentTrouble(ctx, f, 10)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := &levelsJSON{Levels: levels, Estimate: est, Trouble: []*atomicphase.KeyInfo{}}
	if out.Levels == nil {
		out.Levels = []atomicphase.KeyLevel{}
	}
	for _, k := range trouble {
		out.Trouble = append(out.Trouble, h.redacted(k))
	}
	writeJSON(w, http.StatusOK, out)
}

// keysJSON is GET api/keys's answer: a page and where the next starts.
type keysJSON struct {
	Keys []*apiKeyJSON          `json:"keys"`
	Next *atomicphase.KeyCursor `json:"next"`
}

func (h *Handler) apiKeys(w http.ResponseWriter, r *http.Request) {
	f, err := h.parseFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	pg, err := h.listKeys(r.Context(), f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := &keysJSON{Keys: []*apiKeyJSON{}, Next: pg.Next}
	for _, k := range pg.Keys {
		out.Keys = append(out.Keys, h.redacted(k))
	}
	writeJSON(w, http.StatusOK, out)
}

// lookupJSON is GET api/lookup's answer: the key that sent a downstream
// key, and the phase.
type lookupJSON struct {
	Key   *atomicphase.KeyInfo `json:"key"`
	Phase string               `json:"phase"`
}

func (h *Handler) apiLookup(w http.ResponseWriter, r *http.Request) {
	m, err := h.opts.Runner.FindDownstreamKey(r.Context(), r.URL.Query().Get("scope"), r.URL.Query().Get("ref"))
	if err != nil {
		writeError(w, lookupStatus(err), err)
		return
	}
	writeJSON(w, http.StatusOK, &lookupJSON{Key: h.redacted(m.Key), Phase: m.Phase})
}

// auditJSON is GET api/audit's answer: a page of the key's trail, newest
// first, and the ID to pass as before for the next (null on the last).
type auditJSON struct {
	Audit []*atomicphase.AuditEntry `json:"audit"`
	Next  *int64                    `json:"next"`
}

func (h *Handler) apiAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	before, limit, err := auditPaging(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	trail, next, err := h.auditPage(r.Context(), q.Get("scope"), q.Get("key"), before, limit)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, &auditJSON{Audit: trail, Next: next})
}

// historyJSON is api/history's answer.
type historyJSON struct {
	History []*atomicphase.KeyEvent `json:"history"`
}

func (h *Handler) apiHistory(w http.ResponseWriter, r *http.Request) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	if key == "" {
		writeError(w, http.StatusBadRequest, errors.New("api/history needs the key's scope and key: api/history?scope=...&key=..."))
		return
	}
	events, err := h.history(r.Context(), scope, key)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	if events == nil {
		events = []*atomicphase.KeyEvent{}
	}
	writeJSON(w, http.StatusOK, &historyJSON{History: events})
}

func (h *Handler) apiKey(w http.ResponseWriter, r *http.Request) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	if key == "" {
		writeError(w, http.StatusBadRequest, errors.New("api/key needs the key's scope and key: api/key?scope=...&key=..."))
		return
	}
	k, err := h.opts.Runner.Inspect(r.Context(), scope, key)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, h.redacted(k))
}

// readJSON decodes a POST's JSON body into v, refusing any other type.
func readJSON(r *http.Request, v any) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return &errBadAction{"the API's actions take an application/json body"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &errBadAction{fmt.Sprintf("the body is not the action's JSON object: %v", err)}
	}
	return nil
}

func (h *Handler) apiKeyAction(w http.ResponseWriter, r *http.Request) {
	a := &keyAction{}
	if err := readJSON(r, a); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	a.Action = r.PathValue("action")
	done, err := h.do(r.Context(), h.opts.Actor(r), a, nil)
	if err != nil {
		writeError(w, statusOf(err), errors.New(h.actionError(a.Scope, a.Key, err)))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"done": done})
}

// bulkJSON is a bulk action's body: the filter, as the key list's
// parameters, and whether to act or only count.
type bulkJSON struct {
	Filter map[string]string `json:"filter"`
	DryRun *bool             `json:"dry_run"`
}

func (h *Handler) apiBulk(w http.ResponseWriter, r *http.Request) {
	b := &bulkJSON{}
	if err := readJSON(r, b); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	if b.DryRun == nil {
		writeError(w, http.StatusBadRequest, errors.New(`a bulk action says "dry_run": true to count, or false to act`))
		return
	}
	v := map[string][]string{}
	for k, s := range b.Filter {
		if !contains(filterFields, k) {
			writeError(w, http.StatusBadRequest, fmt.Errorf("filter field %q is unknown; use %v", k, filterFields))
			return
		}
		v[k] = []string{s}
	}
	f, err := h.parseFilter(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	res, err := h.bulkDo(r.Context(), h.opts.Actor(r), r.PathValue("action"), f, *b.DryRun)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
