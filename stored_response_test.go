package atomicphase_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// cookieWorkflow responds with a session cookie and a location, storing both
// when opts allows the cookie.
func cookieWorkflow(t *testing.T, name string, opts *atomicphase.WorkflowOpts, header, value string) *atomicphase.Workflow[struct{}] {
	t.Helper()
	return atomicphase.MustWorkflow(name, startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("respond", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("made")).WithHeader("Location", "/things/1").WithHeader(header, value), nil
		}),
	}, opts)
}

// A response that would hand one client's cookie to whoever replays the key
// is refused: nothing is stored, the key is parked, and the error says how
// to allow it.
func TestPerClientHeaderIsNotStoredUnlessNamed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf := cookieWorkflow(t, "cookie_refused", nil, "Set-Cookie", "session=alice")
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: "k1", Method: "POST", Path: "/things"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.ErrorContains(t, err, "WorkflowOpts.ReplayHeaders")
	info, err := b.runner.Inspect(b.ctx, "s", "k1")
	require.NoError(t, err)
	require.Nil(t, info.Response, "nothing is stored")
	require.Equal(t, atomicphase.KeyParked, info.Status)

	allowed := cookieWorkflow(t, "cookie_allowed", &atomicphase.WorkflowOpts{ReplayHeaders: []string{"set-cookie"}}, "Set-Cookie", "session=alice")
	resp, err := b.runner.Run(b.ctx, allowed, atomicphase.Request{Scope: "s", Key: "k2", Method: "POST", Path: "/things"})
	require.NoError(t, err)
	require.Equal(t, "session=alice", resp.Header.Get("Set-Cookie"))
	replay, err := b.runner.Run(b.ctx, allowed, atomicphase.Request{Scope: "s", Key: "k2", Method: "POST", Path: "/things"})
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, "session=alice", replay.Header.Get("Set-Cookie"), "a named header is replayed")
}

// A value with CR or LF is refused when stored: net/http would not send it
// as it is.
func TestHeaderValueWithControlCharactersIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i, v := range []string{"a\r\nSet-Cookie: x=1", "a\nb", "nul\x00"} {
		wf := cookieWorkflow(t, "ctl_"+string(rune('a'+i)), nil, "X-Note", v)
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: "k" + string(rune('a'+i)), Method: "POST", Path: "/things"})
		require.ErrorIs(t, err, atomicphase.ErrPermanent, "%q", v)
		require.ErrorContains(t, err, "control characters")
	}
}

// A row stored before the policy (or written by hand) that holds a
// per-client or hop-by-hop header replays without it.
func TestReplayDropsHeadersThePolicyRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf := cookieWorkflow(t, "legacy_cookie", nil, "X-Note", "fine")
	req := atomicphase.Request{Scope: "s", Key: "k", Method: "POST", Path: "/things"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET response_header = $1::jsonb WHERE scope = 's' AND idempotency_key = 'k'`,
		`{"Location": ["/things/1"], "Set-Cookie": ["session=alice"], "Connection": ["close"], "X-Bad": ["a\nb"]}`)
	require.NoError(t, err)
	for _, replay := range []func() (*atomicphase.Response, error){
		func() (*atomicphase.Response, error) { return b.runner.Run(b.ctx, wf, req) },
		func() (*atomicphase.Response, error) { return b.runner.Resume(b.ctx, "s", "k") },
	} {
		resp, err := replay()
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		require.Equal(t, http.Header{"Location": {"/things/1"}}, resp.Header)
	}
}

func TestReplayHeadersRefusesHopByHop(t *testing.T) {
	t.Parallel()
	_, err := atomicphase.NewWorkflow("hop", startEmpty[struct{}], []atomicphase.Phase[struct{}]{atomicphase.Local("p", respondOK)},
		&atomicphase.WorkflowOpts{ReplayHeaders: []string{"Connection", "bad name"}})
	require.Error(t, err)
	require.ErrorContains(t, err, "Connection describes one connection")
	require.ErrorContains(t, err, `"bad name" is not a header name`)
	require.False(t, errors.Is(err, atomicphase.ErrPermanent))
}

// What is stored with a key is bounded: the path at the door, the response
// when a phase hands it over (a response too large to store is a bug: the
// phase fails permanently, and nothing is stored).
func TestStoredSizesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxPathLength: 16, MaxResponseBytes: 8, MaxResponseHeaderBytes: 20})
	wf := atomicphase.MustWorkflow("sized", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("respond", func(_ context.Context, _ atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("0123456789")), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: "long", Method: "POST", Path: "/x?q=0123456789abcdef"})
	require.ErrorIs(t, err, atomicphase.ErrTooLong)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	_, err = b.runner.Inspect(b.ctx, "s", "long")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound, "nothing is stored for a path too long")

	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: "body", Method: "POST", Path: "/x"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.ErrorContains(t, err, "Config.MaxResponseBytes")

	hdr := cookieWorkflow(t, "sized_header", nil, "X-Note", "0123456789")
	_, err = b.runner.Run(b.ctx, hdr, atomicphase.Request{Scope: "s", Key: "hdr", Method: "POST", Path: "/x"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.ErrorContains(t, err, "Config.MaxResponseHeaderBytes")

	_, err = atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{MaxPathLength: -1, MaxResponseBytes: -1, MaxResponseHeaderBytes: -1})
	require.ErrorContains(t, err, "Config.MaxPathLength is -1")
	require.ErrorContains(t, err, "Config.MaxResponseBytes is -1")
	require.ErrorContains(t, err, "Config.MaxResponseHeaderBytes is -1")
}
