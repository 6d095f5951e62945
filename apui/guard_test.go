package apui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// send sends a request to the console with the headers given ("Host" sets
// the request's Host) and returns its status and body.
func (b *testBundle) send(t *testing.T, method, path, contentType, body string, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}

// DNS rebinding: a request for a host the console does not serve is
// answered 421, read or action, whatever its Origin and Sec-Fetch-Site say
// (under rebinding both agree with the attacker's Host); a POST from an
// origin the console does not serve is refused even on the console's own
// host.
func TestRebindingHostIsAnswered421(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{AllowedHosts: []string{"127.0.0.1", "localhost"}})
	port := strings.TrimPrefix(b.srv.URL[strings.LastIndex(b.srv.URL, ":"):], ":")
	attacker := map[string]string{"Host": "attacker.example:" + port, "Origin": "http://attacker.example:" + port,
		"Sec-Fetch-Site": "same-origin"}

	code, body := b.send(t, "GET", "/api/keys?scope=bob", "", "", attacker)
	require.Equal(t, http.StatusMisdirectedRequest, code, body)
	require.NotContains(t, body, "parked-1", "no key is served to the attacker's name")
	code, _ = b.send(t, "GET", "/", "", "", attacker)
	require.Equal(t, http.StatusMisdirectedRequest, code)
	code, _ = b.send(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`, attacker)
	require.Equal(t, http.StatusMisdirectedRequest, code)
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status, "the refused POST changed nothing")

	// The console's own host, with an Origin it does not serve.
	code, _ = b.send(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`,
		map[string]string{"Origin": "http://attacker.example:" + port})
	require.Equal(t, http.StatusForbidden, code)
	code, _ = b.send(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`,
		map[string]string{"Origin": "null"})
	require.Equal(t, http.StatusForbidden, code, "an opaque origin is no host the console serves")
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status)

	// The hosts it serves, on any port; an Origin of its own.
	code, body = b.send(t, "GET", "/api/keys?scope=bob", "", "", map[string]string{"Host": "localhost:" + port})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "parked-1")
	code, body = b.send(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`,
		map[string]string{"Origin": b.srv.URL, "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", "parked-1").Status)
}

func TestAllowedHostsMatching(t *testing.T) {
	t.Parallel()
	l, err := newHostList([]string{"Ops.Example.com.", "127.0.0.1:8081", "::1", "[fe80::1]:9000"})
	require.NoError(t, err)
	for host, want := range map[string]bool{
		"ops.example.com": true, "OPS.example.com:443": true, "ops.example.com.:8080": true,
		"127.0.0.1:8081": true, "127.0.0.1:8082": false, "127.0.0.1": false,
		"[::1]:8081": true, "[::1]": true, "[fe80::1]:9000": true, "[fe80::1]:9001": false,
		"example.com": false, "ops.example.com.attacker.example": false, "": false,
	} {
		require.Equal(t, want, l.allows(host), host)
	}
	_, err = newHostList([]string{"http://ops.example.com"})
	require.ErrorContains(t, err, "AllowedHosts holds host names")
}

// Cookie tossing: a page of another origin that can set the console's
// cookie (another port of the same address, a sibling subdomain) and post
// the same value as the form's token gets nothing, even from a browser
// that sends neither Sec-Fetch-Site nor Origin: the token is an HMAC of
// the cookie under the handler's secret.
func TestTossedCookieIsNoFormToken(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	tossed := strings.Repeat("ab", 32)
	u, err := url.Parse(b.srv.URL + "/")
	require.NoError(t, err)
	b.client.Jar.SetCookies(u, []*http.Cookie{{Name: csrfCookie, Value: tossed, Path: "/"}})
	form := url.Values{"csrf": {tossed}, "action": {"forget"}, "scope": {"alice"}, "key": {"finished-1"}}
	code, body := b.post(t, "/key", form)
	require.Equal(t, http.StatusForbidden, code, body)
	require.True(t, b.exists(t, "alice", "finished-1"), "the tossed cookie forgot nothing")

	// The console's own page, with the tossed cookie: its form's token is
	// the HMAC, which works.
	_, page := b.get(t, "/key?scope=alice&key=finished-1")
	form.Set("csrf", csrf(t, page))
	require.NotEqual(t, tossed, form.Get("csrf"))
	code, body = b.post(t, "/key", form)
	require.Equal(t, http.StatusOK, code, body)
	require.False(t, b.exists(t, "alice", "finished-1"))
}

// A POST the browser says comes from another origin of the same site (a
// page on another port, a sibling subdomain) is refused with the right
// token; so is one whose Origin is not the Host, from a browser that sends
// no Sec-Fetch-Site.
func TestSameSiteOtherOriginPostIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, page := b.get(t, "/key?scope=bob&key=parked-1")
	form := url.Values{"csrf": {csrf(t, page)}, "action": {"unpark"}, "scope": {"bob"}, "key": {"parked-1"}}
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://127.0.0.1:1"},
	} {
		code, body := b.send(t, "POST", "/key", "application/x-www-form-urlencoded", form.Encode(), h)
		require.Equal(t, http.StatusForbidden, code, "%v: %s", h, body)
		code, body = b.send(t, "POST", "/api/key/unpark", "application/json", `{"scope":"bob","key":"parked-1"}`, h)
		require.Equal(t, http.StatusForbidden, code, "%v: %s", h, body)
	}
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", "parked-1").Status, "the refused POSTs changed nothing")
	code, body := b.send(t, "POST", "/key", "application/x-www-form-urlencoded", form.Encode(),
		map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": b.srv.URL})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", "parked-1").Status)
}

// Over TLS the form token's cookie has a name the browser only lets a
// secure page of the console's own host set: __Host- at the root, and
// __Secure- under a prefix (where __Host-'s Path=/ would not hold).
func TestCookiePrefixesUnderTLS(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for prefix, want := range map[string]string{"": "__Host-apui_csrf", "/console": "__Secure-apui_csrf"} {
		h, err := NewHandler(&Options{Runner: b.runner, Prefix: prefix})
		require.NoError(t, err)
		srv := httptest.NewTLSServer(h)
		t.Cleanup(srv.Close)
		client := srv.Client() // trusts the test server's certificate
		resp, err := client.Get(srv.URL + prefix + "/key?scope=bob&key=parked-1")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		cookies := resp.Cookies()
		require.Len(t, cookies, 1)
		c := cookies[0]
		require.Equal(t, want, c.Name, "prefix %q", prefix)
		require.True(t, c.Secure)
		require.True(t, c.HttpOnly)
		if prefix == "" {
			require.Equal(t, "/", c.Path)
		}

		// A form posted with that cookie works; the plain name is not read.
		form := url.Values{"csrf": {csrf(t, string(body))}, "action": {"forget"}, "scope": {"nobody"}, "key": {"nothing"}}
		for _, name := range []string{csrfCookie, want} {
			req, err := http.NewRequest("POST", srv.URL+prefix+"/key", strings.NewReader(form.Encode()))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.AddCookie(&http.Cookie{Name: name, Value: c.Value})
			resp, err := client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			if name == want {
				require.Equal(t, http.StatusNotFound, resp.StatusCode, "the token held: the forget ran (no such key)")
			} else {
				require.Equal(t, http.StatusForbidden, resp.StatusCode, "the unprefixed cookie is not the console's over TLS")
			}
		}
	}
}

func TestFormSecretIsChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := NewHandler(&Options{Runner: b.runner, FormSecret: []byte("short")})
	require.ErrorContains(t, err, "FormSecret is shorter than 32 bytes")
	secret := []byte(strings.Repeat("k", 32))
	h1, err := NewHandler(&Options{Runner: b.runner, FormSecret: secret})
	require.NoError(t, err)
	h2, err := NewHandler(&Options{Runner: b.runner, FormSecret: secret})
	require.NoError(t, err)
	require.Equal(t, h1.formToken("n"), h2.formToken("n"), "replicas with one secret accept each other's forms")
	require.NotEqual(t, h1.formToken("n"), b.handler.formToken("n"), "a handler's own secret by default")
}
