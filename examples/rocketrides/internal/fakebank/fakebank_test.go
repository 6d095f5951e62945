package fakebank

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const body = `{"reference":"r1","account":"acct_driver_1","amount":1500,"currency":"usd"}`

func pay(t *testing.T, s *Server, client *http.Client) (int, error) {
	t.Helper()
	resp, err := client.Post(s.URL+"/payouts", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func lookup(t *testing.T, s *Server) (int, []Payout) {
	t.Helper()
	resp, err := http.Get(s.URL + "/payouts?reference=r1")
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct{ Data []Payout }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Data
}

// TestEveryCallPays: no idempotency keys, every accepted call is a payout,
// and the lookup lists them all; each failure mode acts, or not, as named.
func TestEveryCallPays(t *testing.T) {
	t.Parallel()
	s, err := Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	client := &http.Client{Timeout: 200 * time.Millisecond}

	s.FailNext(ActThen5xx, ActThenDrop, Refuse5xx, Refuse4xx, Hang)
	status, err := pay(t, s, client)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, status)
	_, err = pay(t, s, client)
	require.Error(t, err, "the connection was dropped")
	status, _ = pay(t, s, client)
	require.Equal(t, http.StatusServiceUnavailable, status)
	status, _ = pay(t, s, client)
	require.Equal(t, http.StatusForbidden, status)
	_, err = pay(t, s, client)
	require.Error(t, err, "the call hung until the client gave up")
	status, _ = pay(t, s, client)
	require.Equal(t, http.StatusCreated, status)

	require.Equal(t, 6, s.Calls())
	require.Len(t, s.Payouts(), 3, "the two that acted and the one answered")
	require.Equal(t, map[string]int{"r1": 3}, s.PerReference())
	st, data := lookup(t, s)
	require.Equal(t, http.StatusOK, st)
	require.Len(t, data, 3)

	s.LookupDownFor(2)
	for range 2 {
		st, _ := lookup(t, s)
		require.Equal(t, http.StatusServiceUnavailable, st)
	}
	st, _ = lookup(t, s)
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, 4, s.Lookups())
}
