package app

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The example's console shows its rides' keys, with the ride workflow's
// phases, since the server registered it.
func TestConsoleShowsTheRidesKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/rides", strings.NewReader(rideBody))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "console-1")
	req.Header.Set("Authorization", "Bearer user@example.com")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()

	addr, stop, err := serveConsole(b.runner, "127.0.0.1:0", t.Logf)
	require.NoError(t, err)
	defer stop()
	url := "http://" + addr + "/"
	get := func(path string) string {
		resp, err := http.Get(url + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body)
	}
	body := get("keys?status=finished")
	m := regexp.MustCompile(`href="(/key\?[^"]*console-1[^"]*)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "the ride's key is listed")
	body = get(strings.ReplaceAll(m[1][1:], "&amp;", "&"))
	require.Contains(t, body, `<ol class="phases" id="phases">`, "the workflow's phases are known here")
	require.Contains(t, body, `id="response-status">201<`)
}
