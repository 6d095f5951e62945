package faultinject

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// HTTP breaks the connections of the HTTP transports it made, for
// DropAfterRequest. Give the downstream clients a phase uses a transport
// from Transport, and set Injector.HTTP:
//
//	h := faultinject.NewHTTP()
//	client := &http.Client{Transport: call.Transport(h.Transport(nil))}
//	inj := faultinject.New(rules...)
//	inj.HTTP = h
//
// One HTTP may serve many injectors in turn (the explorer makes one per
// attempt). It is safe for concurrent use.
type HTTP struct {
	mu    sync.Mutex
	armed bool
}

// NewHTTP returns an HTTP with nothing armed.
func NewHTTP() *HTTP { return &HTTP{} }

// errDropped is what the client reads instead of the server's answer.
var errDropped = errors.New("faultinject: connection closed after the server read the request")

// dropNext arms h: the next connection that writes a request loses the
// answer to it.
func (h *HTTP) dropNext() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

// Disarm cancels a DropAfterRequest that no request met yet.
func (h *HTTP) Disarm() {
	h.mu.Lock()
	h.armed = false
	h.mu.Unlock()
}

// take reports whether a write finds h armed, disarming it.
func (h *HTTP) take() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	armed := h.armed
	h.armed = false
	return armed
}

// Transport returns a clone of base (http.DefaultTransport's settings when
// nil) whose connections h can break. Plain-TCP connections only: an
// https request is refused, since the break must see where a request ends.
func (h *HTTP) Transport(base *http.Transport) *http.Transport {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	t := base.Clone()
	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &droppingConn{Conn: c, h: h}, nil
	}
	t.DialTLSContext = func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("faultinject: HTTP.Transport breaks plain-TCP connections only")
	}
	return t
}

// droppingConn is a client connection that, once it wrote a request while
// its HTTP was armed, discards the first bytes of the server's answer (the
// server has read the request and acted on it), closes the socket and fails
// the read: the client never sees the answer.
type droppingConn struct {
	net.Conn
	h *HTTP

	mu       sync.Mutex
	dropping bool
	broken   bool
}

func (c *droppingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.broken {
		c.mu.Unlock()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: errDropped}
	}
	if !c.dropping && c.h.take() {
		c.dropping = true
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *droppingConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	broken := c.broken
	c.mu.Unlock()
	if broken {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: errDropped}
	}
	// net/http reads ahead on an idle connection, before the request is
	// written: whether to drop is decided by what arrives, the answer to a
	// request written while armed.
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	drop := c.dropping
	c.broken = c.broken || drop
	c.mu.Unlock()
	if !drop {
		return n, err
	}
	_ = c.Conn.Close()
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: errDropped}
}
