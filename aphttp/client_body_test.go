package aphttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

// bigProblem answers a problem of status whose body is over 100 KiB (a
// long detail, as a list of field errors would make).
func bigProblem(status int, typ string, retryAfter int) (func(w http.ResponseWriter), []byte) {
	p := aphttp.Problem{Type: typ, Title: "t", Status: status, Detail: strings.Repeat("field x: too long; ", 100<<10/19+1)}
	body, _ := json.Marshal(p)
	return func(w http.ResponseWriter) {
		aphttp.WriteProblem(w, p, retryAfter)
	}, body
}

// TestClientHandsOverALargeProblemWhole: a final problem answer over the
// 64 KiB Do reads into memory is handed over whole, as it came: not cut,
// and with no problem read (Problem nil), not retried even as a 409.
func TestClientHandsOverALargeProblemWhole(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnprocessableEntity, http.StatusConflict} {
		answer, sent := bigProblem(status, "https://example.invalid/problems/fields", 0)
		require.Greater(t, len(sent), 100<<10)
		s := newScripted(t, answer, created)
		resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`))
		require.NoError(t, err)
		require.Equal(t, status, resp.StatusCode)
		require.Equal(t, 1, s.requests(), "not retried")
		require.Nil(t, resp.Problem, "over the bound: not read")
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, string(sent), string(got), "the whole body")
		require.NoError(t, resp.Body.Close())
	}

	// Under the bound, the problem is read and the body is still whole.
	s := newScripted(t, func(w http.ResponseWriter) {
		aphttp.WriteProblem(w, aphttp.Problem{Type: aphttp.ProblemInvalidRequest, Title: "t", Status: 422, Detail: strings.Repeat("y", 60<<10)}, 0)
	})
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NotNil(t, resp.Problem)
	require.Len(t, resp.Problem.Detail, 60<<10)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Greater(t, len(got), 60<<10)
}

// TestClientSaysWhenTheAnswerItKeptWasCut: when Do gives up, the last
// answer it returns was read into memory up to 64 KiB: a longer body reads
// as its first 64 KiB and then an error naming the bound, never as a
// shorter body that ends well.
func TestClientSaysWhenTheAnswerItKeptWasCut(t *testing.T) {
	t.Parallel()
	answer, sent := bigProblem(http.StatusServiceUnavailable, aphttp.ProblemTransientFailure, 100)
	s := newScripted(t, answer)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`).WithContext(ctx))
	require.ErrorIs(t, err, aphttp.ErrGaveUp, "Retry-After: 100 is past the deadline")
	require.NotNil(t, resp)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	require.ErrorContains(t, err, "65536 bytes")
	require.Len(t, got, 64<<10)
	require.Equal(t, string(sent[:64<<10]), string(got))

	// A kept answer under the bound reads whole, and ends well.
	s = newScripted(t, problem(503, aphttp.ProblemTransientFailure, 100))
	resp, err = quick(nil).Do(postTo(t, s.srv.URL, "", `{}`).WithContext(ctx))
	require.ErrorIs(t, err, aphttp.ErrGaveUp)
	defer resp.Body.Close()
	got, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(got), aphttp.ProblemTransientFailure)
}

// TestClientCountsEveryAttemptOfTheAnswerItGaveUpWith: the answer Do gives
// up with counts every attempt, the ones after it that got no answer too.
func TestClientCountsEveryAttemptOfTheAnswerItGaveUpWith(t *testing.T) {
	t.Parallel()
	s := newScripted(t, closing(problem(503, aphttp.ProblemTransientFailure, 0)), hangUp)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := quick(&aphttp.ClientOptions{OnRetry: func(attempt int, _ time.Duration, _ error) {
		if attempt == 3 {
			cancel() // during the wait after the third attempt, lost like the second
		}
	}})
	resp, err := c.Do(postTo(t, s.srv.URL, "", `{}`).WithContext(ctx))
	require.ErrorIs(t, err, aphttp.ErrGaveUp)
	require.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, resp, "the first attempt's answer")
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, 3, resp.Attempts)
	require.Equal(t, 3, s.requests())
}
