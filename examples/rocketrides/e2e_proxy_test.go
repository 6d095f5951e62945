package main

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// proxy is a TCP proxy at a fixed address in front of a backend that can
// change (a server restarted on another port), and the faults of the
// network between them: answers dropped after the backend sent them, and
// an outage, in which every connection breaks and no new one is taken, as
// when the backend's host restarts.
type proxy struct {
	t    *testing.T
	addr string

	mu      sync.Mutex
	ln      net.Listener
	backend string
	conns   map[net.Conn]bool
	n       int // connections accepted

	// dropEvery, when positive, drops the answer of every dropEvery-th
	// connection: its first bytes back from the backend (the backend read
	// the request and acted on it) are discarded and both sides closed.
	dropEvery int // set before the proxy starts
	dropped   atomic.Int32
}

// startProxy listens on a free loopback port and forwards to backend
// (host:port; settable later with setBackend), dropping the answer of
// every dropEvery-th connection when dropEvery is positive.
func startProxy(t *testing.T, backend string, dropEvery int) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, addr: ln.Addr().String(), ln: ln, backend: backend, conns: map[net.Conn]bool{}, dropEvery: dropEvery}
	go p.serve(ln)
	t.Cleanup(func() { p.outage() })
	return p
}

func (p *proxy) setBackend(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backend = addr
}

// outage breaks every connection and stops listening: a client meets
// broken connections, then refused ones.
func (p *proxy) outage() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// restore listens again, at the same address.
func (p *proxy) restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err, "listen again at %s", p.addr)
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.serve(ln)
}

func (p *proxy) serve(ln net.Listener) {
	for {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.ln != ln { // an outage began
			p.mu.Unlock()
			_ = client.Close()
			return
		}
		p.n++
		drop := p.dropEvery > 0 && p.n%p.dropEvery == 0
		backend := p.backend
		p.conns[client] = true
		p.mu.Unlock()
		go p.forward(client, backend, drop)
	}
}

func (p *proxy) forward(client net.Conn, backend string, drop bool) {
	server, err := net.Dial("tcp", backend)
	if err != nil {
		p.forget(client)
		return
	}
	p.mu.Lock()
	p.conns[server] = true
	p.mu.Unlock()
	defer p.forget(client, server)
	go func() {
		_, _ = io.Copy(server, client)
		_ = server.Close()
	}()
	if drop {
		// The backend answered: it read the request and acted. The
		// answer is lost on the way back.
		if _, err := server.Read(make([]byte, 1)); err == nil {
			p.dropped.Add(1)
		}
		return
	}
	_, _ = io.Copy(client, server)
}

func (p *proxy) forget(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}
