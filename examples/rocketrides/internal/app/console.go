package app

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apui"
)

// serveConsole serves the operator's console on addr, a port of its own,
// until the returned function is called, and returns the address it
// listens on. It is mounted with the server's
// own Runner, which registered the ride workflow: "resume" on a key's page
// runs its phases in this process at once. A real service mounts it behind
// its own operators' authentication; the example serves it on loopback.
func serveConsole(runner *atomicphase.Runner, addr string, logf func(string, ...any)) (string, func(), error) {
	h, err := apui.NewHandler(&apui.Options{Runner: runner, Actor: func(*http.Request) string { return "rocketrides operator" }})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }() // returns ErrServerClosed once stopped
	logf("operator console on http://%s/", ln.Addr())
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
