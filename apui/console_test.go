package apui

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestOverviewShowsLevelsByWorkflowAndStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	code, body := b.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	txt := text(body)
	require.Contains(t, txt, "6 unfinished keys")
	require.Contains(t, txt, "4 parked")
	require.Contains(t, txt, "1 unknown")
	require.Contains(t, txt, "1 abandoned")
	require.Contains(t, txt, "payout · · · · 4", "payout's row: nothing in progress, stale, abandoned or unknown; four parked")
	require.Contains(t, txt, "Oldest unfinished key: workflow payout , parked")
	require.Contains(t, body, "unknown-1", "the recent unknown outcome is listed")
}

func TestKeysFilterAndPageWithACursor(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	seen := []string{}
	path := "/keys?status=parked&limit=3"
	for path != "" {
		code, body := b.get(t, path)
		require.Equal(t, http.StatusOK, code, body)
		for _, k := range []string{"parked-1", "parked-2", "parked-3", "parked-4"} {
			if strings.Contains(body, ">"+k+"<") {
				seen = append(seen, k)
			}
		}
		require.NotContains(t, body, "finished-1")
		path = ""
		if i := strings.Index(body, `id="next" href="`); i >= 0 {
			rest := body[i+len(`id="next" href="`):]
			path = strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
		}
	}
	require.Equal(t, []string{"parked-1", "parked-2", "parked-3", "parked-4"}, seen, "two pages, every parked key once, oldest first")

	_, body := b.get(t, "/keys?error=ACCOUNT+CLOSED&scope=dave&list=1")
	require.Contains(t, body, ">parked-4<")
	require.NotContains(t, body, ">parked-1<")

	code, body := b.get(t, "/keys?older=yesterday")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "write a duration such as 90s")

	// A key with its scope is looked up: its page.
	code, body = b.get(t, "/keys?scope=alice&key=finished-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="response-status">201<`)
}

func TestKeyPageShowsPhasesResponseAndEscapedError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	code, body := b.get(t, "/key?scope=erin&key=hostile-1")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "\x1b", "no raw escape reaches the page")
	require.NotContains(t, body, "\x07")
	require.Contains(t, body, `name \x1b]8;;http://evil.example/\x07click me`, "the escape is shown, written out")
	require.Contains(t, body, "refused\\x1b[2J\nsecond line", "the error keeps its lines")
	require.Contains(t, body, "POST /refund")
	require.Contains(t, body, `<table id="history">`)
	hist := body[strings.Index(body, `<table id="history">`):]
	hist = hist[:strings.Index(hist, "</table>")]
	require.Contains(t, text(hist), "failed running → waiting started 1", "the history shows what went wrong")
	require.Contains(t, hist, "refused\\x1b[2J", "and why, escaped")

	_, body = b.get(t, "/key?scope=frank&key=unknown-1")
	require.Contains(t, text(body), "buy_label next")
	require.Contains(t, text(body), "outcome unknown since")

	_, body = b.get(t, "/key?scope=alice&key=finished-1")
	require.Contains(t, body, `id="response-status">201<`)
	require.Contains(t, body, "Content-Type: application/json")
	require.Contains(t, body, "&#34;item&#34;: &#34;finished-1&#34;", "the body, indented")
	require.Contains(t, body, "Nothing went wrong with this key.")

	code, _ = b.get(t, "/key?scope=nobody&key=nothing")
	require.Equal(t, http.StatusNotFound, code)
}

func TestRedactionHookHidesStateAndBodies(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{Redact: func(k *atomicphase.KeyInfo) {
		k.State = []byte(`"redacted"`)
		if k.Response != nil {
			k.Response.Body = []byte("redacted")
		}
	}})
	_, body := b.get(t, "/key?scope=alice&key=finished-1")
	require.NotContains(t, body, "finished-1&#34;", "the stored body is not shown")
	require.Contains(t, body, `<pre id="response-body">redacted</pre>`)
	_, body = b.get(t, "/key?scope=frank&key=unknown-1")
	require.NotContains(t, body, "&#34;Item&#34;")
	require.Contains(t, string(b.inspect(t, "alice", "finished-1").Response.Body), `"item":"finished-1"`, "the stored body is unchanged")
}

func TestActionsNeedTheFormToken(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	form := url.Values{"action": {"unpark"}, "scope": {"bob"}, "key": {"parked-1"}}
	code, _ := b.post(t, "/key", form)
	require.Equal(t, http.StatusForbidden, code, "no token")
	_, page := b.get(t, "/key?scope=bob&key=parked-1")
	form.Set("csrf", strings.Repeat("0", 64))
	code, _ = b.post(t, "/key", form)
	require.Equal(t, http.StatusForbidden, code, "a token that is not the cookie's")
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status, "refused posts changed nothing")

	// A browser's cross-site POST is refused even with the right token.
	form.Set("csrf", csrf(t, page))
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/key", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status)

	code, body := b.post(t, "/key", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Unparked: the next sweep resumes the key.")
	k := b.inspect(t, "bob", "parked-1")
	require.Equal(t, atomicphase.KeyAbandoned, k.Status)
	require.Nil(t, k.ParkedAt)
}

func TestResumeForgetAndResolveFromTheKeyPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.get(t, "/")
	tok := cookieToken(t, b)

	// Forget a finished key: its row goes.
	code, body := b.post(t, "/key", url.Values{"csrf": {tok}, "action": {"forget"}, "scope": {"alice"}, "key": {"finished-1"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Forgotten")
	require.False(t, b.exists(t, "alice", "finished-1"))
	trail, err := b.runner.AuditTrail(b.ctx, "alice", "finished-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1, "the trail outlives the key")
	require.Equal(t, "console", trail[0].Actor)
	require.Equal(t, "forget", trail[0].Action)
	// An unfinished one cannot be forgotten.
	code, body = b.post(t, "/key", url.Values{"csrf": {tok}, "action": {"forget"}, "scope": {"erin"}, "key": {"hostile-1"}})
	require.Equal(t, http.StatusConflict, code, body)
	require.True(t, b.exists(t, "erin", "hostile-1"))

	// A verdict needs a note.
	code, body = b.post(t, "/key", url.Values{"csrf": {tok}, "action": {"resolve"}, "happened": {"true"}, "scope": {"frank"}, "key": {"unknown-1"}})
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "resolve needs a note")
	code, body = b.post(t, "/key", url.Values{"csrf": {tok}, "action": {"resolve"}, "happened": {"true"}, "scope": {"frank"}, "key": {"unknown-1"},
		"note": {"label service support confirmed lbl-1"}})
	require.Equal(t, http.StatusOK, code, body)
	k := b.inspect(t, "frank", "unknown-1")
	require.NotNil(t, k.ResolvedHappened)
	require.True(t, *k.ResolvedHappened)
	require.Equal(t, "console: label service support confirmed lbl-1", *k.ResolvedNote, "the actor is recorded with the note")

	// Resume now: this process registered the workflow (Run did), so the
	// phases run here, and the call the operator said happened is not made
	// again.
	calls := *b.labels
	code, body = b.post(t, "/key", url.Values{"csrf": {tok}, "action": {"resume"}, "scope": {"frank"}, "key": {"unknown-1"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Resumed")
	require.Equal(t, calls, *b.labels, "the label was not bought twice")
	require.Equal(t, atomicphase.KeyFinished, b.inspect(t, "frank", "unknown-1").Status)

	_, body = b.get(t, "/key?scope=frank&key=unknown-1")
	txt := text(body)
	require.Regexp(t, `Audit trail .* console resume .*resumed.* console resolve label service support confirmed lbl-1 .*happened&#34;: true`, txt,
		"both actions, newest first, with who and what")
}

// cookieToken is the form token of the console's cookie in the client's
// jar: what the console's pages put in their forms.
func cookieToken(t *testing.T, b *testBundle) string {
	t.Helper()
	u, err := url.Parse(b.srv.URL + "/")
	require.NoError(t, err)
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == csrfCookie {
			return b.handler.formToken(c.Value)
		}
	}
	t.Fatal("the console set no token cookie")
	return ""
}

func TestBulkUnparkDryRunThenConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, page := b.get(t, "/keys?status=parked&scope=bob&list=1")
	require.Contains(t, page, `id="dry-run"`)
	tok := csrf(t, page)
	form := url.Values{"csrf": {tok}, "status": {"parked"}, "scope": {"bob"}, "action": {"unpark"}}
	code, body := b.post(t, "/bulk", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, text(body), "This would unpark 3 keys. Nothing has changed yet.")
	for _, k := range []string{"parked-1", "parked-2", "parked-3", "parked-4"} {
		require.Equal(t, atomicphase.KeyParked, b.inspect(t, map[bool]string{true: "dave", false: "bob"}[k == "parked-4"], k).Status, "the dry run changed nothing")
	}
	form.Set("confirm", "yes")
	code, body = b.post(t, "/bulk", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, text(body), "unpark: 3 done, 0 refused")
	for _, k := range []string{"parked-1", "parked-2", "parked-3"} {
		require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", k).Status)
		trail, err := b.runner.AuditTrail(b.ctx, "bob", k, 0)
		require.NoError(t, err)
		require.Len(t, trail, 1)
		require.Equal(t, "unpark", trail[0].Action)
		require.JSONEq(t, `{"done":"unparked","bulk_filter":{"status":"parked","scope":"bob"}}`, string(trail[0].Detail))
	}
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "dave", "parked-4").Status, "another scope's key is untouched")

	// Never over every key at once.
	code, body = b.post(t, "/bulk", url.Values{"csrf": {tok}, "action": {"forget"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "a bulk action needs a filter")
}

// A parked key whose call's outcome is unknown is flagged by the bulk
// forget's dry run and refused by the forget itself: forgetting it would
// let a retry pay again.
func TestBulkForgetSkipsUnsettledKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET unknown_at = now() WHERE scope = 'bob' AND idempotency_key = 'parked-1'`)
	require.NoError(t, err)
	_, page := b.get(t, "/keys?status=parked&scope=bob&list=1")
	tok := csrf(t, page)
	form := url.Values{"csrf": {tok}, "status": {"parked"}, "scope": {"bob"}, "action": {"forget"}}
	code, body := b.post(t, "/bulk", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, text(body), "1 of them may have paid without knowing it")
	form.Set("confirm", "yes")
	code, body = b.post(t, "/bulk", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, text(body), "forget: 2 done, 1 refused")
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status, "the unsettled key stays")
}

func TestReadOnlyConsoleRefusesActions(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{ReadOnly: true})
	_, page := b.get(t, "/key?scope=bob&key=parked-1")
	require.NotContains(t, page, `id="unpark"`, "no action is offered")
	require.Contains(t, page, "read-only")
	code, _ := b.post(t, "/key", url.Values{"csrf": {cookieToken(t, b)}, "action": {"unpark"}, "scope": {"bob"}, "key": {"parked-1"}})
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status)
}

func TestNewHandlerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, err := NewHandler(nil)
	require.ErrorContains(t, err, "Options.Runner is required")
	b := setup(t, nil)
	_, err = NewHandler(&Options{Runner: b.runner, Prefix: "console"})
	require.ErrorContains(t, err, "must start with a slash")
}

// The finished keys are the planner's estimate, never a count: unknown
// until the table is analysed, then what ANALYZE found.
func TestOverviewEstimatesTheFinishedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, body := b.get(t, "/")
	require.Contains(t, text(body), "? finished (not estimated before the first ANALYZE)")
	_, err := b.db.Pool.Exec(b.ctx, "ANALYZE idempotency_keys")
	require.NoError(t, err)
	_, body = b.get(t, "/")
	require.Contains(t, text(body), "≈1 finished (the planner's estimate)", "seven keys, six of them unfinished")
}
