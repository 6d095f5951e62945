package apui

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/atomicphase/atomicphase"
)

// The audit trail as the console shows it: page by page, newest first, so
// that a verdict is never buried under a bulk action's hundred entries.

// auditPageSize is how many entries a key's page shows at once;
// maxAuditPage the most api/audit gives.
const (
	auditPageSize = 20
	maxAuditPage  = 500
)

// auditPaging reads before (the ID the page starts below; 0 for the
// newest) and limit (api/audit's page size).
func auditPaging(q url.Values) (before int64, limit int, err error) {
	limit = atomicphase.DefaultAuditLimit
	if s := q.Get("before"); s != "" {
		if before, err = strconv.ParseInt(s, 10, 64); err != nil || before < 1 {
			return 0, 0, fmt.Errorf("before %q is not an audit entry's id; use the next page's link as given", s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxAuditPage {
			return 0, 0, fmt.Errorf("limit %q is not a page size; use a number from 1 to %d", s, maxAuditPage)
		}
	}
	return before, limit, nil
}

// auditPage reads a page of the key's trail, as shown (shownAudit), and the
// ID to read the next below (nil on the last page).
func (h *Handler) auditPage(ctx context.Context, scope, key string, before int64, limit int) ([]*atomicphase.AuditEntry, *int64, error) {
	trail, err := h.opts.Runner.AuditTrailBefore(ctx, scope, key, before, limit+1)
	if err != nil {
		return nil, nil, err
	}
	var next *int64
	if len(trail) > limit {
		trail = trail[:limit]
		next = &trail[limit-1].ID
	}
	if trail == nil {
		trail = []*atomicphase.AuditEntry{}
	}
	return h.shownAudit(trail), next, nil
}
