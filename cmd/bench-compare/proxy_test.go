package main

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// hangGuard bounds how long a test waits on a connection, so that a
// broken proxy fails the test instead of hanging it; no test measures
// against it.
const hangGuard = time.Minute

// startServer serves every connection on a loopback port with handle, and
// returns its address.
func startServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(hangGuard))
				handle(c)
			})
		}
	})
	return ln.Addr().String()
}

// echo writes back what it reads until the client closes.
func echo(c net.Conn) { _, _ = io.Copy(c, c) }

// startProxy starts a delayProxy to address, closed when the test ends.
func startProxy(t *testing.T, address string, rtt time.Duration) *delayProxy {
	t.Helper()
	p, err := startDelayProxy("tcp", address, rtt)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// dialProxy connects to p.
func dialProxy(t *testing.T, p *delayProxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(hangGuard)))
	return c
}

// TestDelayProxyPassesBytesIntactAndInOrder sends megabytes through the
// proxy to an echo server, in writes of every size, on several
// connections at once, and checks that each gets back exactly what it
// sent.
func TestDelayProxyPassesBytesIntactAndInOrder(t *testing.T) {
	p := startProxy(t, startServer(t, echo), 2*time.Millisecond)
	const conns = 4
	sent := make([][]byte, conns)
	got := make([][]byte, conns)
	errs := make([]error, 2*conns)
	var wg sync.WaitGroup
	for i := range conns {
		c := dialProxy(t, p)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		sent[i] = make([]byte, 3<<20)
		for j := range sent[i] {
			sent[i][j] = byte(rng.Uint32())
		}
		wg.Go(func() {
			got[i], errs[2*i] = io.ReadAll(io.LimitReader(c, int64(len(sent[i]))))
		})
		wg.Go(func() {
			for rest := sent[i]; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(3*proxyChunk))
				if _, err := c.Write(rest[:n]); err != nil {
					errs[2*i+1] = err
					return
				}
				rest = rest[n:]
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for i := range conns {
		require.Equal(t, len(sent[i]), len(got[i]), "connection %d", i)
		require.True(t, bytes.Equal(sent[i], got[i]), "connection %d: the bytes came back changed or out of order", i)
	}
}

// TestDelayProxyAddsTheRoundTrip checks that a round trip through the
// proxy takes at least its rtt, split between the two ways. It is a lower
// bound only: how much longer a round trip takes depends on the machine.
func TestDelayProxyAddsTheRoundTrip(t *testing.T) {
	for _, rtt := range []time.Duration{20 * time.Millisecond, 3*time.Millisecond + 1, 500 * time.Microsecond} {
		t.Run(rtt.String(), func(t *testing.T) {
			p := startProxy(t, startServer(t, echo), rtt)
			require.Equal(t, rtt, p.toServer+p.toClient)
			require.LessOrEqual(t, p.toClient-p.toServer, time.Duration(1))
			c := dialProxy(t, p)
			buf := make([]byte, 64)
			for i := range 5 {
				msg := []byte("ping " + strconv.Itoa(i))
				t0 := time.Now()
				_, err := c.Write(msg)
				require.NoError(t, err)
				_, err = io.ReadFull(c, buf[:len(msg)])
				elapsed := time.Since(t0)
				require.NoError(t, err)
				require.Equal(t, msg, buf[:len(msg)])
				require.GreaterOrEqual(t, elapsed, rtt, "round trip %d", i)
			}
			held, n := p.meanHeld()
			require.GreaterOrEqual(t, n, int64(10))
			require.GreaterOrEqual(t, held, p.toServer)
		})
	}
}

// TestDelayProxyClosesBothSides checks that a side that ends ends the
// other, after what it sent before it ended.
func TestDelayProxyClosesBothSides(t *testing.T) {
	t.Run("the server closes", func(t *testing.T) {
		p := startProxy(t, startServer(t, func(c net.Conn) {
			_, _ = c.Write([]byte("bye"))
		}), time.Millisecond)
		got, err := io.ReadAll(dialProxy(t, p))
		require.NoError(t, err)
		require.Equal(t, "bye", string(got))
	})
	t.Run("the client closes", func(t *testing.T) {
		read := make(chan string, 1)
		p := startProxy(t, startServer(t, func(c net.Conn) {
			b, _ := io.ReadAll(c) // until the proxy closes
			read <- string(b)
		}), time.Millisecond)
		c := dialProxy(t, p)
		_, err := c.Write([]byte("last words"))
		require.NoError(t, err)
		require.NoError(t, c.Close())
		select {
		case got := <-read:
			require.Equal(t, "last words", got)
		case <-time.After(hangGuard):
			t.Fatal("the server's side was not closed")
		}
	})
	t.Run("no server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		address := ln.Addr().String()
		require.NoError(t, ln.Close())
		got, err := io.ReadAll(dialProxy(t, startProxy(t, address, time.Millisecond)))
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the client's connection was left open")
		}
		require.Empty(t, got)
	})
	t.Run("the proxy closes", func(t *testing.T) {
		p, err := startDelayProxy("tcp", startServer(t, echo), time.Millisecond)
		require.NoError(t, err)
		c := dialProxy(t, p)
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 1))
		require.NoError(t, err)
		require.NoError(t, p.Close())
		_, err = io.ReadAll(c)
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the client's connection was left open")
		}
		_, err = net.Dial("tcp", p.addr().String())
		require.Error(t, err, "the proxy still accepts connections")
	})
}

// TestDelayProxyRefusesANegativeRTT checks the constructor's one rule.
func TestDelayProxyRefusesANegativeRTT(t *testing.T) {
	_, err := startDelayProxy("tcp", "127.0.0.1:1", -time.Millisecond)
	require.Error(t, err)
}

// TestThroughProxy checks the pool settings that connect through the
// proxy: the proxy's address, for the server and for each fallback to the
// same server, and the proxy forwarding to the server base names.
func TestThroughProxy(t *testing.T) {
	for _, tc := range []struct {
		url, network, address string
		fallbacks             int
	}{
		// sslmode=prefer: TLS first, then without, both to the one server.
		{"postgres://ana@db.example:5433/x?sslmode=prefer", "tcp", "db.example:5433", 1},
		{"postgres://ana@127.0.0.1:5432/x?sslmode=disable", "tcp", "127.0.0.1:5432", 0},
		{"host=/run/postgresql port=5432 user=ana dbname=x", "unix", "/run/postgresql/.s.PGSQL.5432", 0},
		// Another server is dropped: the proxy forwards to the first.
		{"host=a.example,b.example port=5432 user=ana dbname=x sslmode=disable", "tcp", "a.example:5432", 0},
	} {
		base, err := pgxpool.ParseConfig(tc.url)
		require.NoError(t, err)
		baseHost, baseTLS := base.ConnConfig.Host, base.ConnConfig.TLSConfig
		cfg, p, err := throughProxy(base, time.Millisecond)
		require.NoError(t, err, tc.url)
		_ = p.Close()
		require.Equal(t, tc.network, p.network, tc.url)
		require.Equal(t, tc.address, p.address, tc.url)
		require.Equal(t, "127.0.0.1", cfg.ConnConfig.Host, tc.url)
		require.Equal(t, uint16(p.addr().Port), cfg.ConnConfig.Port, tc.url)
		require.Equal(t, baseTLS, cfg.ConnConfig.TLSConfig, tc.url)
		require.Len(t, cfg.ConnConfig.Fallbacks, tc.fallbacks, tc.url)
		for _, f := range cfg.ConnConfig.Fallbacks {
			require.Equal(t, "127.0.0.1", f.Host, tc.url)
			require.Equal(t, uint16(p.addr().Port), f.Port, tc.url)
		}
		require.Equal(t, baseHost, base.ConnConfig.Host, "base is left as it was")
	}
}
