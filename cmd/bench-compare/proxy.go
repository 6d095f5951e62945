package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The proxy's bounds: it reads at most proxyChunk bytes at a time, and
// holds at most proxyQueue chunks per connection and direction; a reader
// with a full queue waits. That is up to 2 MiB in flight each way, far
// more than the request and response of a PostgreSQL round trip.
const (
	proxyChunk = 32 << 10
	proxyQueue = 64
)

// chunkBuffers are the proxy's read buffers, each proxyChunk bytes, reused
// so that a chunk passed on costs no allocation.
var chunkBuffers = sync.Pool{New: func() any {
	b := make([]byte, proxyChunk)
	return &b
}}

// delayProxy is a TCP proxy on a loopback port, in this process, that
// forwards every connection it accepts to one address (the server's) and
// adds a fixed time to every round trip through it: each chunk of bytes it
// reads from either side is held until toServer (on its way to the server)
// or toClient (on its way back) after it arrived, then written on, in the
// order it came.
//
// It adds latency, not a limit on throughput: per connection and
// direction, a reader goroutine reads chunks as they come, stamps each
// with its arrival time and queues it, and a writer goroutine writes each
// at its time, so that the chunks in flight overlap. When either side of
// a connection ends (or fails), the proxy writes on what it had already
// read from that side, then closes both sides: PostgreSQL's protocol has
// no half-closed connections.
type delayProxy struct {
	ln                 net.Listener
	network, address   string // where it forwards to
	toServer, toClient time.Duration

	// ctx ends when the proxy closes, cancelling a dial to the server.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // the open connections, both sides
	closed bool
	wg     sync.WaitGroup // serve and every connection's goroutines

	chunks atomic.Int64 // chunks written on
	held   atomic.Int64 // the time they were held, in all: arrival to write, in nanoseconds
}

// chunk is bytes read from one side, waiting to be written to the other.
type chunk struct {
	buf *[]byte // from chunkBuffers
	n   int
	at  time.Time // when the read returned them
}

// startDelayProxy starts a delayProxy on a free loopback port that
// forwards to address on network (as net.Dial takes them) and adds rtt to
// every round trip: rtt/2 on the way to address, the rest on the way back.
func startDelayProxy(network, address string, rtt time.Duration) (*delayProxy, error) {
	if rtt < 0 {
		return nil, fmt.Errorf("the proxy's round-trip time %s is negative", rtt)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start the proxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &delayProxy{ln: ln, network: network, address: address, toServer: rtt / 2, toClient: rtt - rtt/2,
		ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// addr is the proxy's address: connect there to reach the server
// through it.
func (p *delayProxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// meanHeld is the mean time the proxy has held a chunk, whichever way it
// went, and how many chunks it has written on.
func (p *delayProxy) meanHeld() (time.Duration, int64) {
	n := p.chunks.Load()
	if n == 0 {
		return 0, 0
	}
	return time.Duration(p.held.Load() / n), n
}

// Close stops accepting connections, closes every open one and waits for
// the proxy's goroutines to end.
func (p *delayProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
	return err
}

// serve accepts connections until the proxy closes.
func (p *delayProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.isClosed() {
				return
			}
			// A passing failure (out of file descriptors, say): this
			// client's connection fails; wait a little before the next.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// isClosed reports whether Close has begun.
func (p *delayProxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track records an open connection, for Close; false when the proxy is
// closed already (the caller then closes c).
func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// closeConn closes a tracked connection.
func (p *delayProxy) closeConn(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// forward connects client to the server and passes bytes both ways until
// either side ends. A client whose server cannot be reached finds its
// connection closed.
func (p *delayProxy) forward(client net.Conn) {
	if !p.track(client) {
		_ = client.Close()
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	server, err := d.DialContext(p.ctx, p.network, p.address)
	if err != nil {
		p.closeConn(client)
		return
	}
	if !p.track(server) {
		_ = server.Close()
		p.closeConn(client)
		return
	}
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			p.closeConn(client)
			p.closeConn(server)
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(server, client, p.toServer, closeBoth) })
	wg.Go(func() { p.pipe(client, server, p.toClient, closeBoth) })
	wg.Wait()
}

// pipe reads src's bytes and writes each chunk to dst delay after it
// arrived, in order, until src ends or dst fails; then it closes both
// sides of the connection (closeBoth).
func (p *delayProxy) pipe(dst, src net.Conn, delay time.Duration, closeBoth func()) {
	queue := make(chan chunk, proxyQueue)
	var writer sync.WaitGroup
	writer.Go(func() {
		failed := false
		for c := range queue {
			if !failed {
				sleepUntil(c.at.Add(delay))
				p.held.Add(int64(time.Since(c.at)))
				p.chunks.Add(1)
				if _, err := dst.Write((*c.buf)[:c.n]); err != nil {
					failed = true
					closeBoth() // which ends the reader below
				}
			}
			chunkBuffers.Put(c.buf)
		}
		closeBoth()
	})
	for {
		buf := chunkBuffers.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n > 0 {
			queue <- chunk{buf: buf, n: n, at: time.Now()}
		} else {
			chunkBuffers.Put(buf)
		}
		if err != nil {
			break
		}
	}
	close(queue)
	writer.Wait()
}

// sleepUntil returns at t or after it, as soon after as it can. The
// runtime's timers can wake a sleeper up to a millisecond late when the
// process is otherwise idle, more than the delays the proxy is for, so
// the last stretch is slept by preciseSleep.
func sleepUntil(t time.Time) {
	d := time.Until(t)
	if d > 2*time.Millisecond {
		time.Sleep(d - time.Millisecond)
		d = time.Until(t)
	}
	if d > 0 {
		preciseSleep(d)
	}
}

// throughProxy starts a delayProxy to the server base connects to, adding
// rtt to every round trip, and returns a copy of base that connects
// through it (with base's TLS settings, which the proxy passes through
// untouched). Of base's fallback servers, only those at its own address
// are kept: the proxy forwards to that one.
func throughProxy(base *pgxpool.Config, rtt time.Duration) (*pgxpool.Config, *delayProxy, error) {
	cc := base.ConnConfig
	network, address := pgconn.NetworkAddress(cc.Host, cc.Port)
	p, err := startDelayProxy(network, address, rtt)
	if err != nil {
		return nil, nil, err
	}
	cfg := base.Copy()
	host, port := p.addr().IP.String(), uint16(p.addr().Port)
	var fallbacks []*pgconn.FallbackConfig
	for _, f := range cfg.ConnConfig.Fallbacks {
		if f.Host == cc.Host && f.Port == cc.Port {
			f.Host, f.Port = host, port
			fallbacks = append(fallbacks, f)
		}
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, port, fallbacks
	return cfg, p, nil
}
