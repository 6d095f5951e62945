// Package apui is the operator's console for an atomicphase key table: an
// http.Handler that serves server-rendered pages (the levels of unfinished
// keys, a filtered list of keys, a key's page) and the actions an operator
// takes on keys (resume, unpark, forget, resolve, and the bulk versions over
// a filter with a dry run), together with the same reads and actions as a
// JSON admin API under api/.
//
// Mount it in your own server, behind your own authentication, under a
// prefix of your choice:
//
//	h, err := apui.NewHandler(&apui.Options{Runner: runner, Prefix: "/console"})
//	mux.Handle("/console/", requireOperator(h))
//
// or serve it standalone with the CLI's ui command. Its templates and
// stylesheet are embedded; it needs no build step and no script. No page
// counts the key table or skips with an offset: lists follow a cursor, and
// the levels read the unfinished keys (docs/console.md gives the index that
// keeps that cheap on a table of millions).
//
// Every action is a POST, refused when the browser says it comes from
// another origin (net/http's CrossOriginProtection) or, with
// Options.AllowedHosts, when it names a host the console does not serve
// (DNS rebinding); the pages' forms also carry a token bound to a cookie
// under a secret of the handler, and the JSON API accepts application/json
// bodies only. docs/console.md describes the pages, the API, and what the
// console defends against.
package apui

import (
	"crypto/rand"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase"
)

// Options configure the console. Runner is required; every other field has
// a default.
type Options struct {
	// Runner reads and changes the keys. Required. Its registered workflows
	// name the phases on a key's page, and make "resume" run a key's phases
	// at once instead of scheduling it for the sweep.
	Runner *atomicphase.Runner
	// Prefix is the path the handler is mounted under, without a trailing
	// slash ("/console"); links and forms are built on it. Defaults to "" (the
	// root).
	Prefix string
	// ReadOnly hides the actions and answers every POST with 403 Forbidden.
	// Defaults to false.
	ReadOnly bool
	// Actor names who makes a request, as the embedding service knows them
	// (from its session, a header its proxy sets, the basic-auth user): it
	// is recorded in the note of every verdict given from the console.
	// Defaults to a function that returns "console".
	Actor func(r *http.Request) string
	// Redact is called on a copy of every key before it is shown or served:
	// blank or rewrite what operators must not see (card numbers in the
	// state, tokens in the stored response). Every error text the console
	// shows goes through it too, as a KeyInfo's LastError: a key's own, and
	// those of actions on a key (a resume that fails again, a bulk action's
	// failures, an audit entry's), passed as a KeyInfo that holds only the
	// key's scope and key besides. So does what an audit entry repeats of
	// a verdict: the entry's note, as the KeyInfo's ResolvedNote, and its
	// result, as its ResolvedResult (blanked, each reads "(redacted)").
	// While it is set, the key list cannot be filtered by error text,
	// which would let a guessed text match what it hides; rewrite error
	// text with the Runner's Config.RedactError instead, which applies
	// before the text is stored (the console applies it too), so that the
	// filter stays: it finds a key whose error contains the text both as
	// stored and as shown, never by what the page hides of a text stored
	// before. Defaults to showing all.
	Redact func(k *atomicphase.KeyInfo)
	// PageSize is how many keys a page of the list shows. Defaults to 50.
	PageSize int
	// BulkLimit is the most keys one bulk action changes; a filter that
	// selects more changes the oldest BulkLimit, and the dry run says so.
	// Defaults to 1000.
	BulkLimit int
	// AllowedHosts are the hosts the console answers to, as a request's
	// Host header names them: a name or an address, matching any port
	// ("ops.example.com", "127.0.0.1", "::1"), or with a port matching that
	// one only ("localhost:8081"). A request for another host is answered
	// 421 Misdirected Request, and a POST whose Origin names another host
	// is refused. This is the defence against DNS rebinding, where a page
	// whose name its author points at the console's address is same-origin
	// with it: set it wherever the console is reachable without
	// credentials that the browser would have to send for the attacker's
	// name (atomicphase ui sets it to its listen address and the loopback
	// names). Defaults to nil: any host.
	AllowedHosts []string
	// FormSecret keys the tokens the pages' forms carry (an HMAC of a
	// random cookie), so that a page that sets the cookie cannot know the
	// token. Give every replica behind one load balancer the same secret,
	// at least 32 bytes. Defaults to 32 random bytes drawn by NewHandler: a
	// form is then valid in the process that served it.
	FormSecret []byte
}

// Handler is the console: an http.Handler.
type Handler struct {
	opts  Options
	mux   *http.ServeMux
	pages map[string]*template.Template
	// hosts are Options.AllowedHosts (nil: any); secret keys the form
	// tokens; crossOrigin refuses another origin's POSTs (guard.go).
	hosts       *hostList
	secret      []byte
	crossOrigin *http.CrossOriginProtection
	// samples are the levels this process read in the last hour, for the
	// overview's chart (chart.go).
	samples levelSamples
}

// NewHandler returns the console for opts.
func NewHandler(opts *Options) (*Handler, error) {
	if opts == nil || opts.Runner == nil {
		return nil, errors.New("apui: Options.Runner is required: pass the Runner of the key table to show")
	}
	o := *opts
	o.Prefix = strings.TrimSuffix(o.Prefix, "/")
	if o.Prefix != "" && !strings.HasPrefix(o.Prefix, "/") {
		return nil, errors.New("apui: Options.Prefix must start with a slash, as in \"/console\"")
	}
	if o.Actor == nil {
		o.Actor = func(*http.Request) string { return "console" }
	}
	if o.PageSize <= 0 {
		o.PageSize = 50
	}
	if o.BulkLimit <= 0 {
		o.BulkLimit = 1000
	}
	h := &Handler{opts: o, mux: http.NewServeMux(), crossOrigin: http.NewCrossOriginProtection()}
	var err error
	if h.hosts, err = newHostList(o.AllowedHosts); err != nil {
		return nil, err
	}
	switch {
	case len(o.FormSecret) == 0:
		h.secret = make([]byte, 32)
		_, _ = rand.Read(h.secret) // crypto/rand.Read never fails
	case len(o.FormSecret) < 32:
		return nil, errors.New("apui: Options.FormSecret is shorter than 32 bytes: draw 32 random bytes, or leave it empty for a secret of the process")
	default:
		h.secret = o.FormSecret
	}
	if err = h.parseTemplates(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	p := o.Prefix
	h.mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET "+p+"/{$}", h.overview)
	h.mux.HandleFunc("GET "+p+"/keys", h.keys)
	h.mux.HandleFunc("GET "+p+"/key", h.key)
	h.mux.HandleFunc("GET "+p+"/versions", h.versions)
	h.mux.HandleFunc("POST "+p+"/key", h.keyAction)
	h.mux.HandleFunc("POST "+p+"/bulk", h.bulk)
	h.mux.HandleFunc("GET "+p+"/api/levels", h.apiLevels)
	h.mux.HandleFunc("GET "+p+"/api/keys", h.apiKeys)
	h.mux.HandleFunc("GET "+p+"/api/key", h.apiKey)
	h.mux.HandleFunc("GET "+p+"/api/lookup", h.apiLookup)
	h.mux.HandleFunc("GET "+p+"/api/audit", h.apiAudit)
	h.mux.HandleFunc("GET "+p+"/api/history", h.apiHistory)
	h.mux.HandleFunc("GET "+p+"/api/versions", h.apiVersions)
	h.mux.HandleFunc("POST "+p+"/api/key/{action}", h.apiKeyAction)
	h.mux.HandleFunc("POST "+p+"/api/bulk/{action}", h.apiBulk)
	return h, nil
}

// ServeHTTP serves the console.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The pages show keys' state and stored responses: never cache them,
	// never frame them, never guess a type.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
	// same-origin, not no-referrer: a browser sends the Origin of a form
	// POST only where the policy lets the referrer go, and "null" under
	// no-referrer, which the rebinding check must refuse (guard.go). The
	// console's own pages then send their origin, and no other origin is
	// sent a console URL.
	w.Header().Set("Referrer-Policy", "same-origin")
	if !h.guard(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}
