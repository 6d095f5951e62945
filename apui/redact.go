package apui

import (
	"encoding/json"
	"errors"

	"github.com/atomicphase/atomicphase"
)

// Redaction: what the console shows of a key, and of every error text,
// after the Runner's Config.RedactError and Options.Redact. Error texts
// leave the console by many paths (a key's last error, the answer to an
// action that failed, a bulk action's failures, the audit trail): each
// goes through errorText, and the audit stores none.

// redactedText is what an error text the Redact hook blanked reads as.
const redactedText = "(error text redacted)"

// redacted returns a copy of k passed through the redaction hooks.
func (h *Handler) redacted(k *atomicphase.KeyInfo) *atomicphase.KeyInfo {
	c := *k
	if k.Response != nil {
		resp := *k.Response
		resp.Header = k.Response.Header.Clone()
		c.Response = &resp
	}
	if k.LastError != nil {
		// Stored before Config.RedactError was set, perhaps.
		msg := h.opts.Runner.RedactError(*k.LastError)
		c.LastError = &msg
	}
	if k.DownstreamKeys != nil {
		c.DownstreamKeys = make(map[string]string, len(k.DownstreamKeys))
		for p, d := range k.DownstreamKeys {
			c.DownstreamKeys[p] = d
		}
	}
	if h.opts.Redact != nil {
		h.opts.Redact(&c)
	}
	return &c
}

// errorText is an error text about the key (scope, key) as the console
// may show it: through Config.RedactError, then Options.Redact as the
// key's LastError.
func (h *Handler) errorText(scope, key, text string) string {
	text = h.opts.Runner.RedactError(text)
	if h.opts.Redact == nil {
		return text
	}
	c := &atomicphase.KeyInfo{Scope: scope, Key: key, LastError: &text}
	h.opts.Redact(c)
	if c.LastError == nil || *c.LastError == "" {
		return redactedText
	}
	return *c.LastError
}

// errorsRedacted reports whether error texts may be hidden from the
// operator, so that no filter may search them.
func (h *Handler) errorsRedacted() bool { return h.opts.Redact != nil }

// knownErrors are the errors whose text the console wrote or the library
// fixed: they carry nothing from a client or a downstream, and are shown
// as they are.
var knownErrors = []error{atomicphase.ErrKeyNotFound, atomicphase.ErrKeyFinished, atomicphase.ErrKeyUnfinished,
	atomicphase.ErrKeyNotParked, atomicphase.ErrKeyParked, atomicphase.ErrKeyPaid, atomicphase.ErrInProgress,
	atomicphase.ErrOutcomeUnsettled, atomicphase.ErrStoreUnavailable}

// actionError is the text of an action's error as the console shows it:
// its own words for what it refused, the library's for the known refusals,
// and anything else (a phase's error, from a resume that failed again)
// through errorText.
func (h *Handler) actionError(scope, key string, err error) string {
	var rf *resumeFailed
	if errors.As(err, &rf) {
		return resumeFailedText + h.actionError(scope, key, rf.err)
	}
	var bad *errBadAction
	if errors.As(err, &bad) {
		return bad.msg
	}
	for _, known := range knownErrors {
		if errors.Is(err, known) {
			return known.Error()
		}
	}
	return h.errorText(scope, key, err.Error())
}

// auditError is what the audit trail records of an action's error: never
// the error's text, which may quote what a client sent and would be kept
// for as long as the trail, shown to whoever reads it; the key's last
// error (redacted where it is shown) says why.
func auditError(err error) string {
	var rf *resumeFailed
	if errors.As(err, &rf) {
		return resumeFailedText + auditError(rf.err)
	}
	var bad *errBadAction
	if errors.As(err, &bad) {
		return bad.msg
	}
	for _, known := range knownErrors {
		if errors.Is(err, known) {
			return known.Error()
		}
	}
	return "failed: the key's last error, or the console's log, says why"
}

// redactedNote is what an audit entry's note, or a verdict's result, the
// Redact hook blanked reads as.
const redactedNote = "(redacted)"

// shownAudit is the audit trail as the console shows it. An entry carries
// what Redact may hide on the key: a verdict's note and result, given
// again in the entry's note and detail (and any operator's note is as
// free as a verdict's), and an error text an older release recorded in
// its detail. Each goes through the hooks as the key's field would: the
// note as its ResolvedNote, the detail's result as its ResolvedResult, the
// detail's error through errorText, in one call of Redact with a KeyInfo
// that holds only the key's scope and key besides.
func (h *Handler) shownAudit(trail []*atomicphase.AuditEntry) []*atomicphase.AuditEntry {
	out := make([]*atomicphase.AuditEntry, len(trail))
	for i, e := range trail {
		out[i] = h.shownEntry(e)
	}
	return out
}

// shownEntry is one entry of the trail as the console shows it.
func (h *Handler) shownEntry(e *atomicphase.AuditEntry) *atomicphase.AuditEntry {
	var d map[string]any
	if len(e.Detail) > 0 && json.Unmarshal(e.Detail, &d) != nil {
		d = nil
		if h.opts.Redact != nil {
			// Not the console's, nor the CLI's: no field of it is known
			// to be safe to show.
			c := *e
			c.Note, c.Detail = redactedNote, json.RawMessage(`"`+redactedNote+`"`)
			return &c
		}
	}
	msg, hasError := d["error"].(string)
	result, hasResult := d["result"]
	if h.opts.Redact == nil {
		if !hasError {
			return e
		}
		d["error"] = h.opts.Runner.RedactError(msg)
		return withDetail(e, e.Note, d)
	}
	k := &atomicphase.KeyInfo{Scope: e.Scope, Key: e.Key}
	if e.Note != "" {
		note := e.Note
		k.ResolvedNote = &note
	}
	if hasResult {
		raw, err := json.Marshal(result)
		if err != nil {
			raw = nil
		}
		k.ResolvedResult = raw
	}
	if hasError {
		text := h.opts.Runner.RedactError(msg)
		k.LastError = &text
	}
	h.opts.Redact(k)
	note := ""
	switch {
	case e.Note == "":
	case k.ResolvedNote == nil || *k.ResolvedNote == "":
		note = redactedNote
	default:
		note = *k.ResolvedNote
	}
	if hasResult {
		if len(k.ResolvedResult) == 0 || !json.Valid(k.ResolvedResult) {
			d["result"] = redactedNote
		} else {
			d["result"] = json.RawMessage(k.ResolvedResult)
		}
	}
	if hasError {
		if k.LastError == nil || *k.LastError == "" {
			d["error"] = redactedText
		} else {
			d["error"] = *k.LastError
		}
	}
	return withDetail(e, note, d)
}

// withDetail is a copy of e with note and the detail d.
func withDetail(e *atomicphase.AuditEntry, note string, d map[string]any) *atomicphase.AuditEntry {
	c := *e
	c.Note = note
	if d != nil {
		raw, err := json.Marshal(d)
		if err != nil {
			raw = json.RawMessage(`"` + redactedNote + `"`)
		}
		c.Detail = raw
	}
	return &c
}
