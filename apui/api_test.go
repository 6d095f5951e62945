package apui

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// apiCall sends a request to the JSON API and decodes its answer into out.
func (b *testBundle) apiCall(t *testing.T, method, path, contentType, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req) // no cookie: the API needs none
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), string(raw))
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), string(raw))
	}
	return resp.StatusCode
}

func TestAPIReadsAndActs(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	var levels levelsJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/levels?workflow=payout", "", "", &levels))
	require.Len(t, levels.Levels, 1)
	require.Equal(t, atomicphase.KeyLevel{Workflow: "payout", Status: atomicphase.KeyParked, Count: 4, Oldest: levels.Levels[0].Oldest}, levels.Levels[0])

	var page keysJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?status=parked&limit=3", "", "", &page))
	require.Len(t, page.Keys, 3)
	require.NotNil(t, page.Next)
	require.Equal(t, "parked-3", page.Next.Key)

	var k atomicphase.KeyInfo
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/key?scope=alice&key=finished-1", "", "", &k))
	require.Equal(t, 201, k.Response.Status)

	var e map[string]string
	require.Equal(t, http.StatusNotFound, b.apiCall(t, "GET", "/api/key?scope=x&key=y", "", "", &e))
	require.Contains(t, e["error"], "not found")

	var hist historyJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/history?scope=erin&key=hostile-1", "", "", &hist))
	require.NotEmpty(t, hist.History)
	require.Equal(t, "failed", hist.History[0].Event)
	require.NotNil(t, hist.History[0].Error, "why it failed")
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/history?scope=alice&key=finished-1", "", "", &hist))
	require.Empty(t, hist.History, "nothing went wrong with it")
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "GET", "/api/history?scope=alice", "", "", &e))

	// Actions take JSON only: a form (what a cross-site page can send
	// without a preflight) is refused, and changes nothing.
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/key/unpark", "application/x-www-form-urlencoded",
		"scope=bob&key=parked-1", &e))
	require.Contains(t, e["error"], "application/json")
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status)

	var done map[string]string
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`, &done))
	require.Equal(t, "unparked", done["done"])
	require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", "parked-1").Status)

	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/key/explode", "application/json", `{"scope":"bob","key":"parked-1"}`, &e))
	require.Contains(t, e["error"], `no action "explode"`)
	require.Equal(t, http.StatusConflict, b.apiCall(t, "POST", "/api/key/unpark", "application/json", `{"scope":"alice","key":"finished-1"}`, &e))

	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/key/resolve", "application/json",
		`{"scope":"frank","key":"unknown-1","happened":true,"note":"carrier portal","result":{"label_id":"lbl-9"}}`, &done))
	require.Equal(t, "resolved", done["done"])
	require.JSONEq(t, `{"label_id":"lbl-9"}`, string(b.inspect(t, "frank", "unknown-1").ResolvedResult))
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/key/resolve", "application/json",
		`{"scope":"frank","key":"unknown-1","happened":false,"note":"x","result":"lbl-9"}`, &e))
	require.Contains(t, e["error"], "a call that did not happen has no result")

	var res bulkResult
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/forget", "application/json",
		`{"filter":{"status":"parked"},"dry_run":true}`, &res))
	require.Equal(t, 3, res.Selected)
	require.Equal(t, 0, res.Done)
	require.True(t, b.exists(t, "bob", "parked-2"))
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/forget", "application/json",
		`{"filter":{"status":"parked"},"dry_run":false}`, &res))
	require.Equal(t, 3, res.Done)
	require.False(t, b.exists(t, "bob", "parked-2"))
	require.False(t, b.exists(t, "dave", "parked-4"))
	require.True(t, b.exists(t, "bob", "parked-1"), "the key unparked before is no longer selected")

	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/bulk/forget", "application/json", `{"filter":{"status":"parked"}}`, &e))
	require.Contains(t, e["error"], "dry_run")
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "POST", "/api/bulk/forget", "application/json",
		`{"filter":{"tenant":"x"},"dry_run":true}`, &e))
	require.Contains(t, e["error"], `filter field "tenant" is unknown`)
}

func TestLookUpByDownstreamKeyInItsScopeOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.NotEmpty(t, b.labelRef)
	code, body := b.get(t, "/keys?scope=frank&ref="+b.labelRef)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "<h1>Key unknown-1</h1>")
	code, body = b.get(t, "/keys?scope=bob&ref="+b.labelRef)
	require.Equal(t, http.StatusNotFound, code, "another scope cannot find frank's key")
	require.Contains(t, body, "no key of the scope sent this downstream key")

	var m lookupJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/lookup?scope=frank&ref="+b.labelRef, "", "", &m))
	require.Equal(t, "unknown-1", m.Key.Key)
	require.Equal(t, "buy_label", m.Phase)
	var e map[string]string
	require.Equal(t, http.StatusBadRequest, b.apiCall(t, "GET", "/api/lookup?ref="+b.labelRef, "", "", &e))
	require.Contains(t, e["error"], "needs the scope")
}

// Unpark refuses a key that is not parked (409, the library's words),
// changing and recording nothing; resume makes such a key due, its
// attempts as they were.
func TestUnparkRefusesAKeyNotParked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := b.inspect(t, "erin", "hostile-1")
	var e map[string]string
	require.Equal(t, http.StatusConflict, b.apiCall(t, "POST", "/api/key/unpark", "application/json", `{"scope":"erin","key":"hostile-1"}`, &e))
	require.Equal(t, atomicphase.ErrKeyNotParked.Error(), e["error"])
	trail, err := b.runner.AuditTrail(b.ctx, "erin", "hostile-1", 0)
	require.NoError(t, err)
	require.Empty(t, trail, "a refused action records nothing")

	// Without the workflow's code, resume schedules the key for the sweep.
	standalone, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	h, err := NewHandler(&Options{Runner: standalone})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	var done map[string]string
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/key/resume", "application/json", `{"scope":"erin","key":"hostile-1"}`, &done))
	require.Equal(t, "scheduled", done["done"])
	after := b.inspect(t, "erin", "hostile-1")
	require.Equal(t, before.Attempts, after.Attempts)
	require.NotNil(t, after.NextAttemptAt)
	require.False(t, after.NextAttemptAt.After(time.Now()), "due now")
}
