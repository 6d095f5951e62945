package fakestripe_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

type reply struct {
	status int
	header http.Header
	body   []byte
}

func setup(t *testing.T) *fakestripe.Server {
	t.Helper()
	s, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func charge(t *testing.T, s *fakestripe.Server, key string, form url.Values) reply {
	t.Helper()
	req, err := http.NewRequest("POST", s.URL+"/v1/charges", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, body}
}

func params(customer string) url.Values {
	return url.Values{"amount": {"2000"}, "currency": {"usd"}, "customer": {customer}}
}

// errorOf decodes Stripe's error envelope.
func errorOf(t *testing.T, r reply) (typ, code, msg string) {
	t.Helper()
	var e struct {
		Error struct{ Type, Code, Message string }
	}
	require.NoError(t, json.Unmarshal(r.body, &e), "%s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	return e.Error.Type, e.Error.Code, e.Error.Message
}

func TestChargeAndReplay(t *testing.T) {
	t.Parallel()
	s := setup(t)
	first := charge(t, s, "k1", params("cus_1"))
	require.Equal(t, 200, first.status, "%s", first.body)
	var ch struct{ ID, Customer, Status string }
	require.NoError(t, json.Unmarshal(first.body, &ch))
	require.Equal(t, "ch_fake_000001", ch.ID)
	require.Equal(t, "succeeded", ch.Status)

	again := charge(t, s, "k1", params("cus_1"))
	require.Equal(t, 200, again.status)
	require.Equal(t, first.body, again.body, "the first answer, byte for byte")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, []fakestripe.Charge{{ID: "ch_fake_000001", Customer: "cus_1", Amount: 2000, IdempotencyKey: "k1"}}, s.Charges())
	require.Equal(t, 2, s.Requests())
}

func TestRequestsWithoutAKeyChargeEveryTime(t *testing.T) {
	t.Parallel()
	s := setup(t)
	require.Equal(t, 200, charge(t, s, "", params("cus_1")).status)
	require.Equal(t, 200, charge(t, s, "", params("cus_1")).status)
	require.Len(t, s.Charges(), 2)
}

func TestKeyReusedWithOtherParametersIsRejected(t *testing.T) {
	t.Parallel()
	s := setup(t)
	require.Equal(t, 200, charge(t, s, "k1", params("cus_1")).status)

	other := params("cus_1")
	other.Set("amount", "2500")
	r := charge(t, s, "k1", other)
	require.Equal(t, http.StatusBadRequest, r.status)
	typ, _, msg := errorOf(t, r)
	require.Equal(t, "idempotency_error", typ)
	require.True(t, strings.HasPrefix(msg, "Keys for idempotent requests can only be used with the same parameters they were first used with."), msg)
	require.Contains(t, msg, "'k1'")
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
	require.Len(t, s.Charges(), 1, "nothing charged")

	// The order of the form's fields is not a different request.
	reordered := "customer=cus_1&currency=usd&amount=2000"
	req, err := http.NewRequest("POST", s.URL+"/v1/charges", strings.NewReader(reordered))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
}

func TestDeclineIsStoredLikeASuccess(t *testing.T) {
	t.Parallel()
	s := setup(t)
	first := charge(t, s, "k", params("cus_declined_2"))
	require.Equal(t, http.StatusPaymentRequired, first.status)
	typ, code, _ := errorOf(t, first)
	require.Equal(t, "card_error", typ)
	require.Equal(t, "card_declined", code)
	again := charge(t, s, "k", params("cus_declined_2"))
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Empty(t, s.Charges())
}

func TestInvalidParametersAreNotStored(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, form := range []url.Values{
		{"amount": {"2000"}, "currency": {"usd"}},
		{"amount": {"-1"}, "currency": {"usd"}, "customer": {"cus_1"}},
		{"amount": {"lots"}, "currency": {"usd"}, "customer": {"cus_1"}},
	} {
		r := charge(t, s, "k", form)
		require.Equal(t, http.StatusBadRequest, r.status)
		typ, code, _ := errorOf(t, r)
		require.Equal(t, "invalid_request_error", typ)
		require.Equal(t, "parameter_missing", code)
	}
	require.Equal(t, 200, charge(t, s, "k", params("cus_1")).status, "a corrected request may reuse the key")
	require.Len(t, s.Charges(), 1)
}

func TestFailNextFailsWithoutEffect(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.FailNext(2)
	for range 2 {
		r := charge(t, s, "k", params("cus_1"))
		require.Equal(t, http.StatusInternalServerError, r.status)
		typ, _, _ := errorOf(t, r)
		require.Equal(t, "api_error", typ)
	}
	require.Empty(t, s.Charges())
	r := charge(t, s, "k", params("cus_1"))
	require.Equal(t, 200, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "the failures stored nothing")
	require.Len(t, s.Charges(), 1)
	require.Equal(t, 3, s.Requests())
}
