package apui

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase"
)

// The filter of the key list, the bulk actions and the API, read from a
// query string or a form: status, workflow, scope, older (a Go duration:
// "90s", "2h"), error (text the last error contains), key (a client key),
// limit, and after_t/after_s/after_k (the cursor of the next page).

// filterFields are the fields a filter is read from, in the order the
// links and forms write them.
var filterFields = []string{"status", "workflow", "scope", "older", "error", "key"}

// parseFilter reads a filter, reporting the first bad field in words an
// operator can act on. While error texts are redacted, no filter may
// search them.
func (h *Handler) parseFilter(v url.Values) (*atomicphase.KeyPageFilter, error) {
	f, err := parseFilter(v, h.opts.PageSize)
	if err == nil && f.ErrorContains != "" && h.errorsRedacted() {
		return nil, errors.New("the error filter is off while the console redacts keys (Options.Redact): a guessed text would match what the redaction hides; rewrite error texts with the Runner's Config.RedactError to keep it")
	}
	return f, err
}

// parseFilter reads a filter with pageSize as the default limit.
func parseFilter(v url.Values, pageSize int) (*atomicphase.KeyPageFilter, error) {
	// Every list the console reads (pages, the API's, a bulk action's
	// selection) is brief: what a row holds beyond what a list shows
	// (states and bodies up to a megabyte each) is never read for it.
	f := &atomicphase.KeyPageFilter{Brief: true}
	f.Status = atomicphase.KeyStatus(strings.TrimSpace(v.Get("status")))
	if f.Status != "" && !slices.Contains(atomicphase.KeyStatuses(), f.Status) {
		return nil, fmt.Errorf("status %q is not a key status; use in_progress, stale, abandoned, unknown, parked or finished", f.Status)
	}
	f.Workflow = strings.TrimSpace(v.Get("workflow"))
	f.Scope = v.Get("scope")
	f.Key = v.Get("key")
	f.ErrorContains = v.Get("error")
	if s := strings.TrimSpace(v.Get("older")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("older %q is not an age; write a duration such as 90s, 15m or 2h", s)
		}
		f.OlderThan = d
	}
	f.Limit = pageSize
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("limit %q is not a page size; use a number from 1 to 1000", s)
		}
		f.Limit = n
	}
	if s := v.Get("after_t"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, fmt.Errorf("after_t %q is not a time; use the next page's link as given", s)
		}
		f.After = &atomicphase.KeyCursor{CreatedAt: t, Scope: v.Get("after_s"), Key: v.Get("after_k")}
	}
	return f, nil
}

// filterValues writes f's filter fields (not its cursor nor its limit).
func filterValues(f *atomicphase.KeyPageFilter) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("status", string(f.Status))
	set("workflow", f.Workflow)
	set("scope", f.Scope)
	if f.OlderThan > 0 {
		v.Set("older", f.OlderThan.String())
	}
	set("error", f.ErrorContains)
	set("key", f.Key)
	return v
}

// isFiltered reports whether f selects less than every key: bulk actions
// need a filter, so that "every key" is never one click away.
func isFiltered(f *atomicphase.KeyPageFilter) bool {
	return f.Status != "" || f.Workflow != "" || f.Scope != "" || f.OlderThan > 0 || f.ErrorContains != "" || f.Key != ""
}

// cursorValues adds the cursor c to v.
func cursorValues(v url.Values, c *atomicphase.KeyCursor) url.Values {
	v.Set("after_t", c.CreatedAt.UTC().Format(time.RFC3339Nano))
	v.Set("after_s", c.Scope)
	v.Set("after_k", c.Key)
	return v
}

// maxFilterReads bounds the pages of keys one request's error filter
// reads, when the keys the database's filter matches are hidden from the
// console (their text matches only where it is redacted): a request's cost
// stays bounded whatever the key table holds.
const maxFilterReads = 20

// listKeys reads the page of keys f selects. The error filter matches the
// keys whose last error contains the text both as the key table stores it
// (the database's filter) and as the console shows it (through
// Config.RedactError): a text stored before the Runner redacted, or by a
// process that does not, is searched only where it may be shown, so that
// a guessed text cannot find what the page would hide. A page then ends at
// its last key shown, never at one the text matched only where it is
// hidden, and says there is a next page only when one would show a key.
func (h *Handler) listKeys(ctx context.Context, f *atomicphase.KeyPageFilter) (*atomicphase.KeyPage, error) {
	rn := h.opts.Runner
	if f.ErrorContains == "" {
		return rn.ListKeyPage(ctx, f)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = atomicphase.DefaultListLimit
	}
	q := *f
	q.Limit = limit + 1
	want := strings.ToLower(f.ErrorContains)
	var keys []*atomicphase.KeyInfo
	for read := 0; ; read++ {
		pg, err := rn.ListKeyPage(ctx, &q)
		if err != nil {
			return nil, err
		}
		for _, k := range pg.Keys {
			if k.LastError != nil && strings.Contains(strings.ToLower(rn.RedactError(*k.LastError)), want) {
				keys = append(keys, k)
			}
		}
		if len(keys) > limit || pg.Next == nil {
			break
		}
		if read+1 >= maxFilterReads {
			// Keys that match only where their text is hidden: the scan
			// stops, as it would at the table's end (a cursor at a key not
			// shown would say it matched), and the page ends here.
			break
		}
		q.After = pg.Next
	}
	page := &atomicphase.KeyPage{Keys: keys}
	if len(keys) > limit {
		page.Keys = keys[:limit]
		last := keys[limit-1]
		page.Next = &atomicphase.KeyCursor{CreatedAt: last.CreatedAt, Scope: last.Scope, Key: last.Key}
	}
	return page, nil
}
