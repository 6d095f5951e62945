package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lockedBuffer is a buffer the served command writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serveUI starts the ui command with args and returns the console's URL
// and a function that stops it and returns its exit code.
func serveUI(t *testing.T, b *testBundle, args ...string) (string, func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr lockedBuffer
	c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	go func() {
		done <- c.run(ctx, append([]string{"--database-url", b.db.URL, "ui", "--listen", "127.0.0.1:0"}, args...))
	}()
	stop := func() (int, string) { cancel(); return <-done, stderr.String() }
	t.Cleanup(func() { cancel() })
	addr := regexp.MustCompile(`console at (http://\S+/)`)
	for {
		if m := addr.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], stop
		}
		select {
		case code := <-done:
			t.Fatalf("ui exited with %d: %s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestUIServesTheConsoleBehindItsToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, stop := serveUI(t, b, "--token", "s3cret", "--read-only")
	code, _ := get(t, url, "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, url, "wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := get(t, url, "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "read-only")
	code, body = get(t, url+"api/keys?status=parked", "s3cret")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"Key": "parked-1"`)

	req, err := http.NewRequest(http.MethodPost, url+"api/key/unpark", strings.NewReader(`{"scope":"bob","key":"parked-1"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only")
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt)

	exit, stderr := stop()
	require.Equal(t, 0, exit, stderr)
}

func TestUIRefusesAnOpenNetworkAddress(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, nil)
	res := b.run(t, "ui", "--listen", "0.0.0.0:0")
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, "is not a loopback address: give --token or --basic-auth")
	res = b.run(t, "ui", "--basic-auth", "alice")
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, "--basic-auth takes USER:PASSWORD")
}
