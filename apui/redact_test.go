package apui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// hiddenText is a part of hostileError that a redacting console must never
// show.
const hiddenText = "evil.example"

// With Options.Redact blanking the last error, the same text reaches the
// operator by no other path: the answer to a resume whose phase fails
// again (page and API), the audit entry of that resume (stored, and
// served), a bulk action's failures, an older release's audit entry that
// stored the text; and the error filter, which would match the hidden text
// by guessed substrings, is off.
func TestRedactionHoldsOnEveryPath(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{Redact: func(k *atomicphase.KeyInfo) { k.LastError = nil }})

	// A resume from the key's page: the refund phase fails again.
	_, page := b.get(t, "/key?scope=erin&key=hostile-1")
	require.NotContains(t, page, hiddenText, "the key's page")
	code, body := b.post(t, "/key", url.Values{"csrf": {csrf(t, page)}, "action": {"resume"}, "scope": {"erin"}, "key": {"hostile-1"}})
	require.Equal(t, http.StatusInternalServerError, code, body)
	require.Contains(t, body, "resuming it now failed: "+redactedText)
	require.NotContains(t, body, hiddenText, "the answer to a resume that failed again")

	// The same from the API.
	var e map[string]string
	code = b.apiCall(t, "POST", "/api/key/resume", "application/json", `{"scope":"erin","key":"hostile-1"}`, &e)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, e["error"], "resuming it now failed")
	require.NotContains(t, e["error"], hiddenText)

	// A bulk resume's failures.
	var res bulkResult
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/resume", "application/json",
		`{"filter":{"workflow":"refund"},"dry_run":false}`, &res))
	require.Equal(t, 1, res.Failed)
	require.Len(t, res.Failures, 1)
	require.NotContains(t, res.Failures[0], hiddenText, "a bulk action's failures")

	// The audit trail stores no error text, and shows none an older
	// release stored.
	trail, err := b.runner.AuditTrail(b.ctx, "erin", "hostile-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 3)
	for _, entry := range trail {
		require.NotContains(t, string(entry.Detail), hiddenText, "the stored audit entry")
		require.Contains(t, string(entry.Detail), "the key's last error")
	}
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "erin", Key: "hostile-1", Actor: "older", Action: "resume",
		Detail: json.RawMessage(`{"done":"scheduled","error":"resuming failed: ` + hiddenText + `"}`)}))
	var audit map[string][]atomicphase.AuditEntry
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/audit?scope=erin&key=hostile-1", "", "", &audit))
	require.Len(t, audit["audit"], 4)
	raw, err := json.Marshal(audit)
	require.NoError(t, err)
	require.NotContains(t, string(raw), hiddenText, "api/audit")
	_, page = b.get(t, "/key?scope=erin&key=hostile-1")
	require.NotContains(t, page, hiddenText, "the key page's audit trail, and its history")
	var hist historyJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/history?scope=erin&key=hostile-1", "", "", &hist))
	require.NotEmpty(t, hist.History)
	raw, err = json.Marshal(hist)
	require.NoError(t, err)
	require.NotContains(t, string(raw), hiddenText, "api/history")

	// No error filter: a guessed text would find the key.
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "GET", "/api/keys?error=evil", "", "", &e))
	require.Contains(t, e["error"], "the error filter is off")
	code, _ = b.get(t, "/keys?error=evil&list=1")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/bulk/unpark", "application/json",
		`{"filter":{"error":"evil"},"dry_run":true}`, &e))
	_, page = b.get(t, "/keys")
	require.NotContains(t, page, `name="error"`, "the list's form has no error field")
}

// The Runner's Config.RedactError applies to every error text the console
// shows, the errors Resume returns with their original text included; the
// stored text is redacted already, so the error filter stays.
func TestConsoleAppliesTheRunnersRedactError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	runner, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{CallGrace: time.Nanosecond,
		RedactError: func(msg string) string { return strings.ReplaceAll(msg, hiddenText, "[host]") }})
	require.NoError(t, err)
	require.NoError(t, runner.Register(b.workflow["refund"]))
	h, err := NewHandler(&Options{Runner: runner})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b.srv = srv

	var e map[string]string
	code := b.apiCall(t, "POST", "/api/key/resume", "application/json", `{"scope":"erin","key":"hostile-1"}`, &e)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, e["error"], "[host]")
	require.NotContains(t, e["error"], hiddenText)

	// Stored before the Runner redacted: shown redacted.
	var k atomicphase.KeyInfo
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/key?scope=erin&key=hostile-1", "", "", &k))
	require.NotContains(t, *k.LastError, hiddenText)

	var page keysJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?error=[host]", "", "", &page), "the filter searches the redacted text")
	require.Len(t, page.Keys, 1)
	require.Equal(t, "hostile-1", page.Keys[0].Key)
}
