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

// uiToken is a token long enough for the ui command.
const uiToken = "s3cret-s3cret-s3cret"

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
	url, stop := serveUI(t, b, "--token", uiToken, "--read-only")
	code, _ := get(t, url, "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, url, "wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := get(t, url, uiToken)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "read-only")
	code, body = get(t, url+"api/keys?status=parked", uiToken)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"Key": "parked-1"`)

	req, err := http.NewRequest(http.MethodPost, url+"api/key/unpark", strings.NewReader(`{"scope":"bob","key":"parked-1"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+uiToken)
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

// DNS rebinding: a page whose name points at the console's address is
// same-origin with it, so its Origin and Sec-Fetch-Site say nothing; the
// ui command answers 421 to any Host but its listen address, the loopback
// names and the hosts --allowed-host names, for reads and actions alike.
func TestUIAnswers421ToAnotherHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base, stop := serveUI(t, b, "--allowed-host", "ops-1.internal")
	port := base[strings.LastIndex(base, ":")+1 : len(base)-1]
	send := func(method, host, path, body string) (int, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}
	code, body := send("GET", "attacker.example:"+port, "api/keys?scope=bob", "")
	require.Equal(t, http.StatusMisdirectedRequest, code, body)
	require.NotContains(t, body, "parked-1")
	code, _ = send("POST", "attacker.example:"+port, "api/key/unpark", `{"scope":"bob","key":"parked-1"}`)
	require.Equal(t, http.StatusMisdirectedRequest, code)
	require.NotNil(t, b.inspect(t, "bob", "parked-1").ParkedAt, "the key stays parked")

	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "ops-1.internal:" + port} {
		code, body = send("GET", host, "api/keys?scope=bob", "")
		require.Equal(t, http.StatusOK, code, host)
		require.Contains(t, body, "parked-1", host)
	}
	exit, stderr := stop()
	require.Equal(t, 0, exit, stderr)
}

// A token or password is trimmed, and must then be long enough: a quoted
// blank is no secret.
func TestUIRefusesAWeakSecret(t *testing.T) {
	t.Parallel()
	b := setupEmpty(t, nil)
	for _, args := range [][]string{{"--token", " "}, {"--token", "s3cret"}, {"--token", "  s3cret-s3cret  "},
		{"--basic-auth", "ana:pass"}, {"--basic-auth", "ana:  "},
		// Fifteen blanks and a letter: one character of secret.
		{"--basic-auth", "ana:" + strings.Repeat(" ", 15) + "a"}, {"--basic-auth", "ana:\t" + strings.Repeat(" ", 14) + "a "}} {
		res := b.run(t, append([]string{"ui", "--listen", "0.0.0.0:0"}, args...)...)
		require.Equal(t, exitUsage, res.code, "%v: %s", args, res.stderr)
		require.Regexp(t, `give at least 16|both non-empty`, res.stderr, args)
	}
	res := runCLI(t, map[string]string{"ATOMICPHASE_UI_TOKEN": "   "}, "", "--database-url", b.db.URL, "ui")
	require.Equal(t, exitUsage, res.code, res.stderr)
	require.Contains(t, res.stderr, "is blank", "a blank token is a mistake, not an open console")
}

// The audit trail names who authenticated: under --token the token's
// holder, whatever user name the browser's basic auth gave.
func TestUIRecordsWhoAuthenticated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base, stop := serveUI(t, b, "--token", uiToken)
	req, err := http.NewRequest(http.MethodPost, base+"api/key/unpark", strings.NewReader(`{"scope":"bob","key":"parked-1"}`))
	require.NoError(t, err)
	req.SetBasicAuth("the-ciso", uiToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	trail, err := b.runner.AuditTrail(b.ctx, "bob", "parked-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "token", trail[0].Actor, "the user name the request gave is no one's")
	exit, stderr := stop()
	require.Equal(t, 0, exit, stderr)
}
