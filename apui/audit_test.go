package apui

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A verdict followed by 120 bulk unparks is not buried: the key's page
// shows the trail twenty entries at a time, newest first, with a link to
// the older ones, and every entry is reached once; so does api/audit.
func TestAuditTrailIsPagedOnTheKeyPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "frank", Key: "unknown-1", Actor: "ana",
		Action: "resolve", Note: "carrier confirmed the label"}))
	for i := range 120 {
		require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "frank", Key: "unknown-1", Actor: "bulk",
			Action: "unpark", Note: "entry " + strconv.Itoa(i)}))
	}
	older := regexp.MustCompile(`id="audit-older" href="([^"]+)"`)
	rows := regexp.MustCompile(`<tr><td>[^<]+</td><td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td>`)
	seen := map[string]int{}
	pages := 0
	for path := "/key?scope=frank&key=unknown-1"; path != ""; pages++ {
		code, body := b.get(t, path)
		require.Equal(t, http.StatusOK, code, body)
		for _, m := range rows.FindAllStringSubmatch(body[strings.Index(body, `id="audit"`):], -1) {
			seen[m[1]]++
		}
		path = ""
		if m := older.FindStringSubmatch(body); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	require.Equal(t, 7, pages, "121 entries, 20 a page")
	require.Len(t, seen, 121)
	require.Equal(t, 1, seen["carrier confirmed the label"], "the verdict is reached, once")

	var page auditJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/audit?scope=frank&key=unknown-1&limit=100", "", "", &page))
	require.Len(t, page.Audit, 100)
	require.NotNil(t, page.Next)
	require.Equal(t, "entry 119", page.Audit[0].Note)
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/audit?scope=frank&key=unknown-1&limit=100&before="+
		strconv.FormatInt(*page.Next, 10), "", "", &page))
	require.Len(t, page.Audit, 21)
	require.Nil(t, page.Next)
	require.Equal(t, "carrier confirmed the label", page.Audit[20].Note)
	var e map[string]string
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "GET", "/api/audit?scope=frank&key=unknown-1&limit=100000", "", "", &e))
}

// A note of 900 000 bytes is refused before the verdict is taken: nothing
// is recorded, on the key or in its trail.
func TestAuditNoteIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, page := b.get(t, "/key?scope=frank&key=unknown-1")
	require.Contains(t, page, `maxlength="2000"`)
	code, body := b.post(t, "/key", url.Values{"csrf": {csrf(t, page)}, "action": {"resolve"}, "happened": {"false"},
		"scope": {"frank"}, "key": {"unknown-1"}, "note": {strings.Repeat("n", 900_000)}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "the note is 900000 bytes; the most is 2000")
	require.Nil(t, b.inspect(t, "frank", "unknown-1").ResolvedAt, "no verdict was taken")
	trail, err := b.runner.AuditTrail(b.ctx, "frank", "unknown-1", 0)
	require.NoError(t, err)
	require.Empty(t, trail)

	var e map[string]string
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/key/resolve", "application/json",
		`{"scope":"frank","key":"unknown-1","happened":true,"note":"ok","result":"`+strings.Repeat("r", 40_000)+`"}`, &e))
	require.Contains(t, e["error"], "give the downstream's reference")
	require.Nil(t, b.inspect(t, "frank", "unknown-1").ResolvedAt)
}
