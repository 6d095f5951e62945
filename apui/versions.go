package apui

import (
	"net/http"
	"slices"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// The versions page: `atomicphase versions` in the browser. Each version of
// each workflow, with its phases as the processes that run it recorded
// them, whether a process runs it now, and its unfinished keys: an old
// definition may be deleted from the code once it is drained and no
// process runs it.

// versionRow is one version on the page.
type versionRow struct {
	atomicphase.VersionStatus
	// Phases are the recorded phases, joined for reading.
	Phases string
	// Running is whether this process registered it.
	Running bool
}

func (h *Handler) versionRows(r *http.Request) ([]versionRow, error) {
	vs, err := h.opts.Runner.Versions(r.Context())
	if err != nil {
		return nil, err
	}
	rows := make([]versionRow, len(vs))
	for i, v := range vs {
		_, here := h.opts.Runner.WorkflowVersionPhases(v.Workflow, v.Version)
		rows[i] = versionRow{VersionStatus: v, Phases: strings.Join(v.Phases, " → "), Running: here && v.Version != ""}
	}
	slices.SortStableFunc(rows, func(a, b versionRow) int { return strings.Compare(a.Workflow, b.Workflow) })
	return rows, nil
}

func (h *Handler) versions(w http.ResponseWriter, r *http.Request) {
	rows, err := h.versionRows(r)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	h.render(w, r, http.StatusOK, "versions", &page{Title: "Workflow versions", Data: rows})
}

// apiVersions is GET api/versions: Runner.Versions, with drained set.
func (h *Handler) apiVersions(w http.ResponseWriter, r *http.Request) {
	vs, err := h.opts.Runner.Versions(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	type versionJSON struct {
		atomicphase.VersionStatus
		Drained bool `json:"drained"`
	}
	out := make([]versionJSON, len(vs))
	for i, v := range vs {
		out[i] = versionJSON{VersionStatus: v, Drained: v.Drained()}
	}
	writeJSON(w, http.StatusOK, map[string]any{"versions": out})
}
