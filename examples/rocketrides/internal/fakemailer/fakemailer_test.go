package fakemailer_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/fakemailer"
)

const message = `{"to": "user@example.com", "ride_id": 1, "charge_id": "ch_1"}`

func start(t *testing.T) *fakemailer.Server {
	t.Helper()
	s, err := fakemailer.Start(nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func send(ctx context.Context, t *testing.T, s *fakemailer.Server, key, contentType, body string) (int, http.Header, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/messages", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

func TestDeduplicatesByKey(t *testing.T) {
	t.Parallel()
	s := start(t)
	for i, key := range []string{"a", "a", "b"} {
		status, header, err := send(context.Background(), t, s, key, "application/json", message)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, i == 1, header.Get("Idempotent-Replayed") == "true")
	}
	receipts := s.Receipts()
	require.Len(t, receipts, 2)
	require.Equal(t, fakemailer.Receipt{ID: "msg_000001", Key: "a", To: "user@example.com", RideID: 1, ChargeID: "ch_1", At: receipts[0].At}, receipts[0])
	require.Len(t, s.Attempts(), 3)

	status, _, err := send(context.Background(), t, s, "a", "application/json", `{"to": "x@example.com", "ride_id": 1, "charge_id": "ch_1"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, status, "a key reused with another message")
}

func TestRejectsMalformedRequests(t *testing.T) {
	t.Parallel()
	s := start(t)
	for _, c := range []struct {
		key, contentType, body string
		want                   int
	}{
		{"", "application/json", message, http.StatusBadRequest},
		{"k", "text/plain", message, http.StatusUnsupportedMediaType},
		{"k", "application/json", `{"to": "user@example.com", "ride_id": 1}`, http.StatusUnprocessableEntity},
		{"k", "application/json", `not json`, http.StatusUnprocessableEntity},
	} {
		status, _, err := send(context.Background(), t, s, c.key, c.contentType, c.body)
		require.NoError(t, err)
		require.Equal(t, c.want, status, "%+v", c)
	}
	require.Empty(t, s.Receipts())
}

func TestFailNextAndHangNextKeepNothing(t *testing.T) {
	t.Parallel()
	s := start(t)
	s.FailNext(1)
	status, _, err := send(context.Background(), t, s, "k", "application/json", message)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status)

	s.HangNext(1)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, _, err = send(ctx, t, s, "k", "application/json", message)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the hung request never answered")
	require.Empty(t, s.Receipts())

	status, _, err = send(context.Background(), t, s, "k", "application/json", message)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, s.Receipts(), 1)
	require.Equal(t, []fakemailer.Attempt{{"k", 503}, {"k", 0}, {"k", 200}}, s.Attempts())
}
