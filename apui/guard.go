package apui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// What stands between a web page the operator opens and the console's
// actions. Three attacks, three defences, each checked before any handler
// runs:
//
//   - DNS rebinding: a page whose name the attacker points at the console's
//     address is same-origin with the console, so the browser lets it read
//     every answer and send every request, with Sec-Fetch-Site:
//     same-origin and an Origin that equals the Host. Only the Host itself
//     tells: a request for a host the console was not told it serves
//     (Options.AllowedHosts) is answered 421, and a POST whose Origin names
//     such a host is refused.
//   - Cross-origin forms and fetches (another port of the same address, a
//     sibling subdomain: "same-site", which SameSite cookies do not stop):
//     net/http's CrossOriginProtection refuses a POST that the browser says
//     comes from another origin (Sec-Fetch-Site, else Origin against Host).
//   - Cookie tossing: such a page can set the console's cookie, so a form
//     token that only has to equal the cookie can be forged. The token is
//     an HMAC of the cookie's random value under a secret of the handler
//     (Options.FormSecret), which no page can compute.

// hostList is the set of hosts the console answers to.
type hostList struct {
	// names match a host on any port; withPort match host:port exactly.
	names, withPort map[string]bool
}

// newHostList reads Options.AllowedHosts; nil (no check) when empty.
func newHostList(hosts []string) (*hostList, error) {
	if len(hosts) == 0 {
		return nil, nil
	}
	l := &hostList{names: map[string]bool{}, withPort: map[string]bool{}}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" || strings.ContainsAny(h, "/?#@ ") {
			return nil, errors.New(`apui: Options.AllowedHosts holds host names or addresses, with or without a port ("ops.example.com", "127.0.0.1:8081", "::1"), not ` + quote(h))
		}
		if host, port, err := net.SplitHostPort(h); err == nil {
			l.withPort[canonicalHost(host)+":"+port] = true
			continue
		}
		l.names[canonicalHost(h)] = true
	}
	return l, nil
}

// allows reports whether hostport (a Host header, or an Origin's host)
// names a host of the list.
func (l *hostList) allows(hostport string) bool {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, ""
	}
	host = canonicalHost(host)
	if host == "" {
		return false
	}
	return l.names[host] || (port != "" && l.withPort[host+":"+port])
}

// canonicalHost writes a host name as the list compares it: lower case,
// without IPv6 brackets or a trailing dot.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func quote(s string) string { return `"` + s + `"` }

// guard refuses what no handler may see, and reports whether the request
// may go on. Reads are refused only for a host the console does not serve;
// actions (POST) also for another origin and in read-only mode.
func (h *Handler) guard(w http.ResponseWriter, r *http.Request) bool {
	if h.hosts != nil && !h.hosts.allows(r.Host) {
		// 421: this server does not serve that name. Under DNS rebinding
		// the name is the attacker's, and nothing may be answered to it.
		http.Error(w, "the console does not serve the host "+quote(escapeControl(r.Host))+": open it at the address it listens on (Options.AllowedHosts, atomicphase ui --allowed-host)", http.StatusMisdirectedRequest)
		return false
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions {
		return true
	}
	if h.opts.ReadOnly {
		http.Error(w, "the console is read-only", http.StatusForbidden)
		return false
	}
	if h.hosts != nil {
		// Under rebinding the Origin names the attacker's host as well (it
		// equals the Host, so comparing the two proves nothing): it must be
		// a host the console serves. "null" (a sandboxed frame, a file, a
		// page whose Referrer-Policy is no-referrer) is no such host, even
		// when the browser says it is same-origin: behind a proxy that
		// rewrites the Host, the Origin is all that names the page's host,
		// and a rebinding page may hide its own. The console's pages send
		// their origin (Referrer-Policy: same-origin, ServeHTTP).
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			if err != nil || u.Host == "" || !h.hosts.allows(u.Host) {
				msg := "a request from the origin " + quote(escapeControl(o)) + " is refused: the console does not serve it"
				if o == "null" {
					msg += " (a browser sends the origin \"null\" from a page whose Referrer-Policy is no-referrer: the console's pages say same-origin; a proxy or middleware in front of the console must not replace it)"
				}
				http.Error(w, msg, http.StatusForbidden)
				return false
			}
		}
	}
	if err := h.crossOrigin.Check(r); err != nil {
		http.Error(w, "cross-origin request refused: act from the console's own pages", http.StatusForbidden)
		return false
	}
	return true
}

// The form token's cookie. Over TLS the name carries a prefix the browser
// enforces, so that no page of another origin (a sibling subdomain, plain
// HTTP on the same name) can set it: __Host- (Secure, Path=/, no Domain)
// when the console is served at the root, __Secure- (Secure) under a
// prefix, where __Host-'s Path=/ would not hold.
const csrfCookie = "apui_csrf"

// csrfCookieName is the cookie's name for r.
func (h *Handler) csrfCookieName(r *http.Request) string {
	switch {
	case r.TLS == nil:
		return csrfCookie
	case h.opts.Prefix == "":
		return "__Host-" + csrfCookie
	}
	return "__Secure-" + csrfCookie
}

// csrfToken returns the token the request's forms carry, setting a new
// cookie when it has none: the HMAC of the cookie's random value under the
// handler's secret.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	name := h.csrfCookieName(r)
	if c, err := r.Cookie(name); err == nil && len(c.Value) == 64 {
		return h.formToken(c.Value)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	nonce := hex.EncodeToString(b)
	path := h.opts.Prefix
	if path == "" {
		path = "/"
	}
	http.SetCookie(w, &http.Cookie{Name: name, Value: nonce, Path: path, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return h.formToken(nonce)
}

// formToken is the form token of a cookie's value.
func (h *Handler) formToken(nonce string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("apui form token\x00"))
	m.Write([]byte(nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether a form POST carries the token of its cookie.
// A cookie some other page set (cookie tossing) has no token it can know.
func (h *Handler) checkCSRF(r *http.Request) bool {
	c, err := r.Cookie(h.csrfCookieName(r))
	if err != nil || len(c.Value) != 64 {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h.formToken(c.Value)), []byte(r.PostFormValue("csrf"))) == 1
}
