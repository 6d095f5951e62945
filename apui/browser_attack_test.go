package apui

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The attacks a web page the operator opens can make through the
// operator's browser, made by such a page in headless Chromium. Names are
// pointed at 127.0.0.1 by Chromium's own resolver (--host-resolver-rules),
// which is what a DNS rebinding attack, or a sibling subdomain on the
// operator's network, gives an attacker.

// resolveToLoopback is the Chromium flag that resolves every name to
// 127.0.0.1.
var resolveToLoopback = chromedp.Flag("host-resolver-rules", "MAP * 127.0.0.1")

// portOf is the port of a test server.
func portOf(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	return port
}

// waitFor waits for a condition the browser's actions bring about.
func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, 20*time.Millisecond, msg)
}

// DNS rebinding: the attacker's page, at a name that first led to the
// attacker's server and now resolves to 127.0.0.1, is same-origin with the
// console on the same port. Its script reads a scope's keys and unparks
// one; the console answers 421 to both, since it does not serve that name.
func TestRebindingInABrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{AllowedHosts: []string{"127.0.0.1", "localhost"}})
	var posts atomic.Int32
	// The server at the console's address: after the rebinding, the
	// attacker's name leads here, where the page it served first (the one
	// path this test adds) goes on running.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/attacker.html" {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, rebindPage)
			return
		}
		b.handler.ServeHTTP(w, r)
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
	}))
	t.Cleanup(srv.Close)
	ctx := browser(t, resolveToLoopback)

	var out string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate("http://attacker.example:"+portOf(t, srv)+"/attacker.html"),
		chromedp.WaitVisible("#done", chromedp.ByID),
		chromedp.Text("#out", &out, chromedp.ByID)))
	// (Chromium sends a request answered 421 once more, on a new
	// connection, as HTTP says it may.)
	require.GreaterOrEqual(t, posts.Load(), int32(1), "the page's POST reached the console: "+out)
	require.Contains(t, out, "read 421;", "the keys were not served to the attacker's page: "+out)
	require.NotContains(t, out, "parked-1")
	require.Contains(t, out, "unpark 421", out)
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status, "the key stays parked")

	// The same page at the console's own address is the console's page:
	// the check refuses names, not the browser.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)+"/attacker.html"),
		chromedp.WaitVisible("#done", chromedp.ByID),
		chromedp.Text("#out", &out, chromedp.ByID)))
	require.Contains(t, out, "read 200;", out)
	require.Contains(t, out, "parked-1")
	require.Contains(t, out, "unpark 200", out)
}

// rebindPage reads bob's keys and unparks one, and writes what it got.
const rebindPage = `<!doctype html><p id="out"></p><script>
(async () => {
  const read = await fetch('/api/keys?scope=bob');
  const text = await read.text();
  const act = await fetch('/api/key/unpark', {method: 'POST', headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({scope: 'bob', key: 'parked-1'})});
  document.getElementById('out').textContent = 'read ' + read.status + '; ' + text.slice(0, 400) + ' unpark ' + act.status;
  const done = document.createElement('p'); done.id = 'done'; done.textContent = 'done'; document.body.append(done);
})();
</script>`

// Cookie tossing: a page on another port of 127.0.0.1, and one on a
// sibling subdomain, set the console's cookie to a value of their own
// (for a longer path, which the browser sends first) and post a form that
// forgets a finished key with that value as its token. The console refuses
// both: the browser says the POST comes from another origin, and the
// token would not match the tossed cookie anyway.
func TestCookieTossingInABrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{AllowedHosts: []string{"127.0.0.1", "console.example.test"}})
	var posts atomic.Int32
	console := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.handler.ServeHTTP(w, r)
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
	}))
	t.Cleanup(console.Close)
	tossed := strings.Repeat("ab", 32)
	var target string // the console's URL for the page being served
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		domain := ""
		if strings.HasPrefix(r.Host, "evil.example.test") {
			domain = "; domain=example.test"
		}
		fmt.Fprintf(w, tossPage, target, tossed, tossed, domain)
	}))
	t.Cleanup(attacker.Close)
	ctx := browser(t, resolveToLoopback)

	for i, c := range []struct{ name, console, attacker string }{
		{"another port", "http://127.0.0.1:" + portOf(t, console), "http://127.0.0.1:" + portOf(t, attacker)},
		{"a sibling subdomain", "http://console.example.test:" + portOf(t, console), "http://evil.example.test:" + portOf(t, attacker)},
	} {
		// The operator has the console open: its own cookie is set.
		require.NoError(t, chromedp.Run(ctx,
			chromedp.Navigate(c.console+"/key?scope=alice&key=finished-1"), chromedp.WaitVisible("#facts", chromedp.ByID)))
		target = c.console
		require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(c.attacker+"/")))
		waitFor(t, func() bool { return posts.Load() == int32(i+1) }, c.name+": the page's form reached the console")
		require.True(t, b.exists(t, "alice", "finished-1"), c.name+": the tossed cookie forgot nothing")
	}
}

// tossPage sets the console's cookie to a value of its own and posts a
// forget with that value as the form's token.
const tossPage = `<!doctype html>
<form id="f" method="post" action="%s/key">
<input name="csrf" value="%s"><input name="action" value="forget"><input name="scope" value="alice"><input name="key" value="finished-1">
</form><script>
document.cookie = "apui_csrf=%s; path=/key%s";
document.getElementById('f').submit();
</script>`
