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
	atomicphase.ErrInProgress, atomicphase.ErrOutcomeUnsettled, atomicphase.ErrStoreUnavailable}

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

// shownAudit is the audit trail as the console shows it: an error text an
// older release recorded in an entry's detail goes through errorText.
func (h *Handler) shownAudit(trail []*atomicphase.AuditEntry) []*atomicphase.AuditEntry {
	out := make([]*atomicphase.AuditEntry, len(trail))
	for i, e := range trail {
		out[i] = e
		var d map[string]any
		if len(e.Detail) == 0 || json.Unmarshal(e.Detail, &d) != nil {
			continue
		}
		msg, ok := d["error"].(string)
		if !ok {
			continue
		}
		d["error"] = h.errorText(e.Scope, e.Key, msg)
		raw, err := json.Marshal(d)
		if err != nil {
			continue
		}
		c := *e
		c.Detail = raw
		out[i] = &c
	}
	return out
}
