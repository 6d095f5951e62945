package faultinject

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallDialer makes cfg dial connections that LoseCommitAck can break at
// the right instant. Use it on the pool the Runner under test uses:
//
//	cfg, _ := pgxpool.ParseConfig(url)
//	faultinject.InstallDialer(cfg.ConnConfig)
func InstallDialer(cfg *pgx.ConnConfig) {
	base := cfg.DialFunc
	if base == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		base = d.DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := base(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &faultyConn{Conn: c}, nil
	}
}

// errAckLost is what the client sees instead of the commit's answer.
var errAckLost = errors.New("faultinject: connection lost before the commit was acknowledged")

// faultyConn is a net.Conn that can lose the server's answer to the next
// round trip that executes something. Armed between round trips, it lets a
// statement-preparation round trip (Parse/Describe, which pgx sends before
// the first use of a statement on a connection) pass; once the client writes
// an Execute or a simple Query, it reads and discards the server's messages
// up to ReadyForQuery — by then the COMMIT has completed on the server —
// then closes the socket and fails the read, so the client cannot tell
// whether its COMMIT happened.
type faultyConn struct {
	net.Conn

	mu    sync.Mutex
	state ackState
	wbuf  []byte // partial frontend message while armed
	rbuf  []byte // partial backend message while dropping
}

type ackState uint8

const (
	ackNormal   ackState = iota
	ackArmed             // waiting for a round trip that executes
	ackDropping          // that round trip is on the wire: swallow its answer
	ackBroken            // the connection is gone
)

func (c *faultyConn) loseNextAck() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state, c.wbuf, c.rbuf = ackArmed, nil, nil
}

func (c *faultyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	switch c.state {
	case ackBroken:
		c.mu.Unlock()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: errAckLost}
	case ackArmed:
		var executes bool
		c.wbuf, executes = scanMessages(append(c.wbuf, p...), 'E', 'Q')
		if executes {
			c.state = ackDropping
		}
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *faultyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	state := c.state
	c.mu.Unlock()
	switch state {
	case ackBroken:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: errAckLost}
	case ackDropping:
	default:
		return c.Conn.Read(p)
	}
	chunk := make([]byte, 8192)
	for {
		n, err := c.Conn.Read(chunk)
		c.mu.Lock()
		var done bool
		c.rbuf, done = scanMessages(append(c.rbuf, chunk[:n]...), 'Z')
		if done || err != nil {
			c.state = ackBroken
		}
		c.mu.Unlock()
		if done || err != nil {
			_ = c.Conn.Close()
			return 0, &net.OpError{Op: "read", Net: "tcp", Err: errAckLost}
		}
	}
}

// scanMessages walks complete protocol messages (a type byte, then a length
// that counts itself) in buf, reports whether one of the given types was
// among them, and returns the incomplete rest.
func scanMessages(buf []byte, types ...byte) ([]byte, bool) {
	found := false
	for len(buf) >= 5 {
		size := int(binary.BigEndian.Uint32(buf[1:5])) + 1
		if len(buf) < size {
			break
		}
		for _, t := range types {
			found = found || buf[0] == t
		}
		buf = buf[size:]
	}
	return buf, found
}
