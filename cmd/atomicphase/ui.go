package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apui"
)

// uiFlags are the ui command's options.
type uiFlags struct {
	listen       string
	token        string
	basicAuth    string
	readOnly     bool
	allowedHosts []string
}

// minSecret is the shortest token or password the console accepts: a
// secret a browser keeps, guessed over HTTP, must not be a word.
const minSecret = 16

func (c *cli) uiCmd() *cobra.Command {
	var f uiFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the operator's console (web pages and JSON API) over the key table",
		Long: strings.TrimSpace(`
Serve the operator's console: the levels of unfinished keys by workflow and
status, a filtered list of keys, each key's page, and the actions (resume,
unpark, forget, resolve, and bulk versions with a dry run), plus the same as
a JSON admin API under /api/. docs/console.md describes it.

It listens on the loopback interface unless told otherwise, and refuses
another address without --token or --basic-auth. With --token, requests
must carry "Authorization: Bearer TOKEN" (scripts) or basic auth with the
token as password (a browser asks for it); with --basic-auth USER:PASSWORD,
that user and password. Tokens and passwords are at least 16 characters,
not counting the blanks around them.
--read-only hides the actions and refuses every change. The token and
password may come from ATOMICPHASE_UI_TOKEN and ATOMICPHASE_UI_BASIC_AUTH
instead, to keep them off the command line.

It answers only requests for its listen address and the loopback names
(localhost, 127.0.0.1, ::1), and for the hosts --allowed-host names: any
other Host is answered 421, so that a web page whose name is pointed at
this address (DNS rebinding) cannot read or act through your browser. A
listen address of every interface (":8081") answers to each interface's
address; give the machine's names with --allowed-host.

The CLI does not have your workflows' code: "resume" here schedules a key
for the sweep of a process that registered its workflow. Mount the console
in that process (apui.NewHandler) to resume keys at once.`),
		Example: examples(
			`atomicphase ui`,
			`ATOMICPHASE_UI_TOKEN=a-long-random-token atomicphase ui --listen :8081`,
			`atomicphase ui --read-only`,
			`ATOMICPHASE_UI_TOKEN=$(openssl rand -hex 16) atomicphase ui --listen :8081 --allowed-host ops-1.internal`,
		),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("token") {
				f.token = c.getenv("ATOMICPHASE_UI_TOKEN")
			}
			if !cmd.Flags().Changed("basic-auth") {
				f.basicAuth = c.getenv("ATOMICPHASE_UI_BASIC_AUTH")
			}
			// A secret given as blanks (a quoted space, a variable set to
			// one) is a mistake, not a request for an open console.
			if f.token != "" && strings.TrimSpace(f.token) == "" {
				return usageErrorf("--token (or ATOMICPHASE_UI_TOKEN) is blank; give at least %d characters", minSecret)
			}
			return c.serveUI(cmd.Context(), &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8081", "address to listen on; anything but loopback needs --token or --basic-auth")
	fl.StringVar(&f.token, "token", "", "require this bearer token (or basic auth with it as password); default $ATOMICPHASE_UI_TOKEN")
	fl.StringVar(&f.basicAuth, "basic-auth", "", "require basic auth as USER:PASSWORD; default $ATOMICPHASE_UI_BASIC_AUTH")
	fl.BoolVar(&f.readOnly, "read-only", false, "show keys, refuse every action")
	fl.StringArrayVar(&f.allowedHosts, "allowed-host", nil, "a host name (or host:port) the console also answers to, besides its listen address and the loopback names; repeat for more")
	return cmd
}

// uiSettings are the ui command's flags, checked: the secret and who it
// authenticates, and the host the console listens on.
type uiSettings struct {
	flags                 uiFlags
	user, password, token string
	listenHost            string
}

// secretLength counts the characters of a secret as the minimum does:
// without the blanks around it, which a browser's prompt or a quoted
// variable adds as easily as a typo.
func secretLength(s string) int { return utf8.RuneCountInString(strings.TrimSpace(s)) }

// checkUI checks the ui command's flags.
func checkUI(f *uiFlags) (*uiSettings, error) {
	s := &uiSettings{flags: *f}
	// A secret of blanks (a quoted space, a variable set to one) is no
	// secret: it is trimmed, and then must be long enough.
	s.token, s.flags.basicAuth = strings.TrimSpace(f.token), strings.TrimSpace(f.basicAuth)
	if s.token != "" && secretLength(s.token) < minSecret {
		return nil, usageErrorf("--token is %d characters; give at least %d (openssl rand -hex 16 makes one)", secretLength(s.token), minSecret)
	}
	if s.flags.basicAuth != "" {
		var ok bool
		s.user, s.password, ok = strings.Cut(s.flags.basicAuth, ":")
		if !ok || strings.TrimSpace(s.user) == "" || strings.TrimSpace(s.password) == "" {
			return nil, usageErrorf("--basic-auth takes USER:PASSWORD, both non-empty")
		}
		// Counted as the token is, after trimming: fifteen blanks and a
		// letter are one character of secret.
		if n := secretLength(s.password); n < minSecret {
			return nil, usageErrorf("--basic-auth's password is %d characters, not counting the blanks around it; give at least %d", n, minSecret)
		}
	}
	if s.token != "" && s.flags.basicAuth != "" {
		return nil, usageErrorf("give --token or --basic-auth, not both")
	}
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return nil, usageErrorf("--listen %q is not HOST:PORT: %v", f.listen, err)
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" && s.token == "" && s.flags.basicAuth == "" {
		return nil, usageErrorf("--listen %q is not a loopback address: give --token or --basic-auth, so that the console is not open to the network", f.listen)
	}
	s.listenHost = host
	return s, nil
}

// uiConsole builds the console as the ui command serves it over r: the
// handler (whose SampleLevels the command runs), and what the server
// serves, the handler behind the command's authentication. Tests serve
// what it returns, so that they test what an operator runs.
func uiConsole(r *atomicphase.Runner, s *uiSettings) (*apui.Handler, http.Handler, error) {
	h, err := apui.NewHandler(&apui.Options{Runner: r, ReadOnly: s.flags.readOnly, Actor: actor(s.user, s.token),
		AllowedHosts: allowedHosts(s.listenHost, s.flags.allowedHosts)})
	if err != nil {
		return nil, nil, err
	}
	return h, authenticate(h, s.token, s.user, s.password), nil
}

// serveUI serves the console until ctx ends.
func (c *cli) serveUI(ctx context.Context, f *uiFlags) error {
	s, err := checkUI(f)
	if err != nil {
		return err
	}
	return c.withRunner(ctx, func(r *atomicphase.Runner) error {
		h, served, err := uiConsole(r, s)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", s.flags.listen)
		if err != nil {
			return err
		}
		// The overview's chart of the last hour: the levels, sampled.
		sctx, stopSampling := context.WithCancel(ctx)
		sampled := make(chan struct{})
		go func() { defer close(sampled); h.SampleLevels(sctx, 30*time.Second) }()
		defer func() { stopSampling(); <-sampled }()
		srv := &http.Server{Handler: served, ReadHeaderTimeout: 10 * time.Second}
		mode := ""
		if s.flags.readOnly {
			mode = " (read-only)"
		}
		fmt.Fprintf(c.stdout, "console at http://%s/%s\n", ln.Addr(), mode)
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
		}
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			return err
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// actor names who acts, for the audit trail and the verdicts' notes: who
// authenticated, never who a request says it is. With --basic-auth that is
// its user; with --token, whoever holds the token (a browser's basic-auth
// user name is not checked, so it names no one); with neither, the local
// operator.
func actor(user, token string) func(*http.Request) string {
	who := "local"
	switch {
	case user != "":
		who = user
	case token != "":
		who = "token"
	}
	return func(*http.Request) string { return who }
}

// allowedHosts are the hosts the console answers to: the loopback names,
// the listen address (each interface's address when it is every
// interface's), and the operator's own.
func allowedHosts(listenHost string, extra []string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if ip := net.ParseIP(listenHost); listenHost != "" && (ip == nil || !ip.IsUnspecified()) {
		return append(append(hosts, listenHost), extra...)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				hosts = append(hosts, n.IP.String())
			}
		}
	}
	return append(hosts, extra...)
}

// authenticate lets through the requests that carry the token or the
// user's password; with neither set, every request.
func authenticate(h http.Handler, token, user, password string) http.Handler {
	if token == "" && user == "" {
		return h
	}
	eq := func(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, basic := r.BasicAuth()
		ok := false
		switch {
		case token != "":
			bearer, isBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			ok = (isBearer && eq(bearer, token)) || (basic && eq(p, token))
		default:
			ok = basic && eq(u, user) && eq(p, password)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="atomicphase console", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
