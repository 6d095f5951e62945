package apui

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A console without the workflow's code (atomicphase ui) cannot tell
// whether a finished key made a foreign call: its page offers no forget
// but says how to give the key up, a forget is refused with 409 and the
// library's words, and a bulk forget's dry run counts it as skipped. The
// console that has the code forgets a key whose workflow made no call.
func TestConsoleLeavesAFinishedKeyThatMayHavePaid(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, page := b.get(t, "/key?scope=alice&key=finished-1")
	require.Contains(t, page, `id="forget"`, "the checkout workflow has no foreign phase")
	require.NotContains(t, page, `id="forget-paid"`)

	standalone, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	h, err := NewHandler(&Options{Runner: standalone})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	_, page = b.get(t, "/key?scope=alice&key=finished-1")
	require.NotContains(t, page, `id="forget"`)
	require.Contains(t, text(page), "Not forgotten from here: the key finished after a foreign call that may have paid (this process, without the workflow's code, cannot tell that it did not)")
	require.Contains(t, text(page), `atomicphase forget --force --reason "…" alice finished-1`)

	_, list := b.get(t, "/keys?status=finished&scope=alice&list=1")
	code, body := b.post(t, "/key", url.Values{"csrf": {csrf(t, list)}, "action": {"forget"}, "scope": {"alice"}, "key": {"finished-1"}})
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, atomicphase.ErrKeyPaid.Error())
	var e map[string]string
	require.Equal(t, http.StatusConflict, b.apiCall(t, "POST", "/api/key/forget", "application/json", `{"scope":"alice","key":"finished-1"}`, &e))
	require.Equal(t, atomicphase.ErrKeyPaid.Error(), e["error"])
	require.True(t, b.exists(t, "alice", "finished-1"))

	var res bulkResult
	require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/forget", "application/json",
		`{"filter":{"status":"finished","scope":"alice"},"dry_run":true}`, &res))
	require.Equal(t, 1, res.Selected)
	require.Equal(t, 1, res.Paid)
	code, body = b.post(t, "/bulk", url.Values{"csrf": {csrf(t, list)}, "status": {"finished"}, "scope": {"alice"}, "action": {"forget"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, text(body), "1 of them finished after a foreign call that may have paid")
	require.True(t, b.exists(t, "alice", "finished-1"))
}

// A scope or key is a client's text: the commands a page suggests quote
// it for a shell, and write its control characters out.
func TestShellWordQuotesWhatAShellWouldRead(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"alice": "alice", "user_42": "user_42", "4f1c9a7e-checkout": "4f1c9a7e-checkout", "a.b:c/d@e": "a.b:c/d@e",
		"":                 "''",
		"x; curl e | sh":   "'x; curl e | sh'",
		"it's":             `'it'\''s'`,
		"$(reboot)":        "'$(reboot)'",
		"a\x1b]8;;\x07b\n": `'a\x1b]8;;\x07b\n'`,
	} {
		require.Equal(t, want, shellWord(in), "%q", in)
	}
}

// A scope or key that starts with a dash follows "--" on a suggested
// command line, so that the command reads it as an operand, not a flag.
func TestShellArgsEndTheFlagsBeforeADash(t *testing.T) {
	t.Parallel()
	require.Equal(t, "alice k1", shellArgs("alice", "k1"))
	require.Equal(t, "-- alice --force", shellArgs("alice", "--force"))
	require.Equal(t, "-- -x 'a b'", shellArgs("-x", "a b"))
}
