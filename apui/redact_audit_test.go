package apui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// cardNumber is what an operator pasted into a verdict: in its note and
// in the call's result.
const cardNumber = "4111111111111111"

// With Options.Redact blanking a verdict's note and result, the verdict
// the console recorded (and one the CLI recorded) shows them nowhere: not
// on the key's page, in its audit table, or from api/key and api/audit.
// A Redact that rewrites them shows them rewritten in the trail too.
func TestRedactionHidesAVerdictWhereverItIsShown(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{Redact: func(k *atomicphase.KeyInfo) { k.ResolvedNote, k.ResolvedResult = nil, nil }})
	_, page := b.get(t, "/key?scope=frank&key=unknown-1")
	code, body := b.post(t, "/key", url.Values{"csrf": {csrf(t, page)}, "action": {"resolve"}, "scope": {"frank"}, "key": {"unknown-1"},
		"happened": {"true"}, "note": {"card " + cardNumber + " was charged"}, "result": {`{"card":"` + cardNumber + `"}`}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Verdict recorded")
	require.NotContains(t, body, cardNumber, "the key's page, its audit table")
	require.Contains(t, text(body), "console resolve (redacted)")

	// As the CLI records it: the note, and the result in the detail.
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "frank", Key: "unknown-1", Actor: "cli",
		Action: "resolve", Note: "per the bank, card " + cardNumber, Detail: json.RawMessage(`{"happened":true,"result":"` + cardNumber + `"}`)}))
	// An entry whose detail is not the console's object: nothing of it
	// is known to be safe to show.
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "frank", Key: "unknown-1", Actor: "svc",
		Action: "note", Detail: json.RawMessage(`["` + cardNumber + `"]`)}))
	stored, err := b.runner.AuditTrail(b.ctx, "frank", "unknown-1", 0)
	require.NoError(t, err)
	require.Len(t, stored, 3)

	_, page = b.get(t, "/key?scope=frank&key=unknown-1")
	require.NotContains(t, page, cardNumber, "the key's page")
	var k atomicphase.KeyInfo
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/key?scope=frank&key=unknown-1", "", "", &k))
	require.Nil(t, k.ResolvedNote)
	var audit auditJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/audit?scope=frank&key=unknown-1", "", "", &audit))
	require.Len(t, audit.Audit, 3)
	raw, err := json.Marshal(audit)
	require.NoError(t, err)
	require.NotContains(t, string(raw), cardNumber, "api/audit")
	for _, e := range audit.Audit {
		if e.Action == "resolve" {
			require.Equal(t, redactedNote, e.Note)
			var d map[string]any
			require.NoError(t, json.Unmarshal(e.Detail, &d))
			require.Equal(t, redactedNote, d["result"])
			require.Equal(t, true, d["happened"], "what Redact does not hide stays")
		}
	}

	// A Redact that masks the number shows the rest.
	mask := regexp.MustCompile(`\d{12}(\d{4})`)
	masking, err := NewHandler(&Options{Runner: b.runner, Redact: func(k *atomicphase.KeyInfo) {
		if k.ResolvedNote != nil {
			s := mask.ReplaceAllString(*k.ResolvedNote, "…$1")
			k.ResolvedNote = &s
		}
		k.ResolvedResult = []byte(mask.ReplaceAllString(string(k.ResolvedResult), "…$1"))
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(masking)
	t.Cleanup(srv.Close)
	b.srv = srv
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/audit?scope=frank&key=unknown-1", "", "", &audit))
	raw, err = json.Marshal(audit)
	require.NoError(t, err)
	require.NotContains(t, string(raw), cardNumber)
	require.Contains(t, string(raw), "per the bank, card …1111")
	require.Contains(t, string(raw), `"result":"…1111"`)
	require.Contains(t, string(raw), `"result":{"card":"…1111"}`)
}

// With Config.RedactError set after a text was stored (or by a process
// that stores it as it is), the error filter matches only what the
// console shows: a guessed piece of the hidden text finds no key, on the
// list, in the API or in a bulk action's selection, and no page ends at,
// or links past, a key it matched where it is hidden.
func TestErrorFilterMatchesOnlyWhatIsShown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	runner, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{CallGrace: time.Nanosecond,
		RedactError: func(msg string) string { return strings.ReplaceAll(msg, hiddenText, "[host]") }})
	require.NoError(t, err)
	h, err := NewHandler(&Options{Runner: runner, PageSize: 1})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	// Stored before the Runner redacted, and shown redacted.
	require.Contains(t, *b.inspect(t, "erin", "hostile-1").LastError, hiddenText)
	_, page := b.get(t, "/key?scope=erin&key=hostile-1")
	require.NotContains(t, page, hiddenText)

	for _, guess := range []string{"evil", "EVIL.ex", "example/"} {
		var keys keysJSON
		require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?error="+url.QueryEscape(guess), "", "", &keys))
		require.Empty(t, keys.Keys, guess)
		require.Nil(t, keys.Next, guess)
		_, body := b.get(t, "/keys?list=1&error="+url.QueryEscape(guess))
		require.NotContains(t, body, "hostile-1", guess)
		var res bulkResult
		require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/unpark", "application/json",
			`{"filter":{"error":"`+guess+`"},"dry_run":true}`, &res))
		require.Zero(t, res.Selected, guess)
	}
	// What is shown is found.
	var keys keysJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?error="+url.QueryEscape("click me"), "", "", &keys))
	require.Len(t, keys.Keys, 1)
	require.Equal(t, "hostile-1", keys.Keys[0].Key)

	// Pages of one key: the filter's matches in order, each shown, and a
	// next page only while one shows a key. "ex" is in each stored text,
	// and shown in two.
	for k, msg := range map[string]string{"parked-1": "ex one", "parked-2": "at " + hiddenText, "parked-3": "at " + hiddenText, "parked-4": "ex four"} {
		_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET last_error = $1 WHERE idempotency_key = $2`, msg, k)
		require.NoError(t, err)
	}
	var seen []string
	next := "/api/keys?status=parked&error=ex"
	for next != "" {
		var pg keysJSON
		require.Equal(t, http.StatusOK, b.apiCall(t, "GET", next, "", "", &pg))
		for _, k := range pg.Keys {
			seen = append(seen, k.Key)
			require.NotContains(t, *k.LastError, hiddenText)
		}
		next = ""
		if pg.Next != nil {
			require.NotEmpty(t, pg.Keys, "a page that shows nothing links to no next")
			require.NotContains(t, []string{"parked-2", "parked-3"}, pg.Next.Key, "a cursor names a key the text matched where it is hidden")
			next = "/api/keys?" + cursorValues(url.Values{"status": {"parked"}, "error": {"ex"}}, pg.Next).Encode()
		}
	}
	require.Equal(t, []string{"parked-1", "parked-4"}, seen)
	var pg keysJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?status=parked&error=evil", "", "", &pg))
	require.Empty(t, pg.Keys)
	require.Nil(t, pg.Next)
	var res bulkResult
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/unpark", "application/json",
		`{"filter":{"status":"parked","error":"ex"},"dry_run":true}`, &res))
	require.Equal(t, 2, res.Selected)
}
