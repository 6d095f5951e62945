package atomicphase_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestOutcomeAccessors(t *testing.T) {
	t.Parallel()

	t.Run("continue", func(t *testing.T) {
		t.Parallel()
		for _, o := range []atomicphase.Outcome{atomicphase.Continue(), {}} {
			require.True(t, o.Continues())
			_, ok := o.JumpTarget()
			require.False(t, ok)
			_, ok = o.Response()
			require.False(t, ok)
			require.Equal(t, "continue", o.String())
		}
	})

	t.Run("jump", func(t *testing.T) {
		t.Parallel()
		o := atomicphase.JumpTo("ship")
		require.False(t, o.Continues())
		target, ok := o.JumpTarget()
		require.True(t, ok)
		require.Equal(t, "ship", target)
		_, ok = o.Response()
		require.False(t, ok)
		require.Equal(t, `jump to "ship"`, o.String())
		require.Equal(t, o, o.WithHeader("X-Ignored", "1"), "WithHeader leaves a jump alone")
	})

	t.Run("respond", func(t *testing.T) {
		t.Parallel()
		o := atomicphase.Respond(201, []byte(`{"id":1}`))
		require.False(t, o.Continues())
		_, ok := o.JumpTarget()
		require.False(t, ok)
		resp, ok := o.Response()
		require.True(t, ok)
		require.Equal(t, 201, resp.Status)
		require.Equal(t, []byte(`{"id":1}`), resp.Body)
		require.Empty(t, resp.Header)
		require.False(t, resp.Replayed)
		require.Equal(t, "respond 201", o.String())
	})

	t.Run("respond with headers", func(t *testing.T) {
		t.Parallel()
		plain := atomicphase.Respond(201, nil)
		located := plain.WithHeader("Location", "/orders/7")
		o := located.WithHeader("Link", "</a>").WithHeader("Link", "</b>")
		resp, ok := o.Response()
		require.True(t, ok)
		require.Equal(t, http.Header{"Location": {"/orders/7"}, "Link": {"</a>", "</b>"}}, resp.Header)
		require.Equal(t, "respond 201", o.String())

		// WithHeader returns a copy; the outcome it was called on is unchanged.
		resp, _ = plain.Response()
		require.Empty(t, resp.Header)
		resp, _ = located.Response()
		require.Equal(t, http.Header{"Location": {"/orders/7"}}, resp.Header)
	})
}

// parcel is the state of the workflow whose phase functions are unit-tested
// below, the way an application would test its own.
type parcel struct {
	Express bool     `json:"express"`
	Trail   []string `json:"trail"`
}

// triage decides from the state alone and touches no database, so a unit
// test can call it with a nil tx.
func triage(_ context.Context, _ atomicphase.Tx, p *parcel) (atomicphase.Outcome, error) {
	p.Trail = append(p.Trail, "triage")
	if p.Express {
		return atomicphase.JumpTo("ship"), nil
	}
	return atomicphase.Continue(), nil
}

func review(_ context.Context, _ atomicphase.Tx, p *parcel) (atomicphase.Outcome, error) {
	p.Trail = append(p.Trail, "review")
	return atomicphase.Continue(), nil
}

func ship(_ context.Context, _ atomicphase.Tx, p *parcel) (atomicphase.Outcome, error) {
	p.Trail = append(p.Trail, "ship")
	body := []byte(`"standard"`)
	if p.Express {
		body = []byte(`"express"`)
	}
	return atomicphase.Respond(202, body).WithHeader("X-Route", "dock-4"), nil
}

// startParcel takes the one field a client sends; the trail is computed.
func startParcel(in struct {
	Express bool `json:"express"`
}, _ *atomicphase.Request) (parcel, error) {
	return parcel{Express: in.Express}, nil
}

func parcelWorkflow(t *testing.T) *atomicphase.Workflow[parcel] {
	t.Helper()
	wf, err := atomicphase.NewWorkflow("parcel", startParcel, []atomicphase.Phase[parcel]{
		atomicphase.Local("triage", triage).WithJumps("ship"),
		atomicphase.Local("review", review),
		atomicphase.Local("ship", ship),
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true}) // the tests read the finished state
	require.NoError(t, err)
	return wf
}

// TestPhaseFunctionWithoutADatabase is how an application unit-tests a phase
// function: call it with a nil tx (it touches no database) and ask the
// Outcome where the workflow goes.
func TestPhaseFunctionWithoutADatabase(t *testing.T) {
	t.Parallel()
	var phase atomicphase.LocalFunc[parcel] = triage

	express := &parcel{Express: true}
	out, err := phase(context.Background(), nil, express)
	require.NoError(t, err)
	target, ok := out.JumpTarget()
	require.True(t, ok, "an express parcel jumps: %s", out)
	require.Equal(t, "ship", target)

	standard := &parcel{}
	out, err = phase(context.Background(), nil, standard)
	require.NoError(t, err)
	require.True(t, out.Continues(), "a standard parcel goes on to review: %s", out)
	require.Equal(t, []string{"triage"}, standard.Trail)

	out, err = ship(context.Background(), nil, express)
	require.NoError(t, err)
	resp, ok := out.Response()
	require.True(t, ok, "ship responds: %s", out)
	require.Equal(t, 202, resp.Status)
	require.Equal(t, `"express"`, string(resp.Body))
	require.Equal(t, "dock-4", resp.Header.Get("X-Route"))
}

// follow runs phase functions the way the Runner routes them, but by hand,
// with a nil tx, using only the Outcome accessors: it returns the response
// and the state the workflow ends with.
func follow(t *testing.T, names []string, phases []atomicphase.LocalFunc[parcel], p *parcel) atomicphase.Response {
	t.Helper()
	for i := 0; i < len(phases); {
		out, err := phases[i](context.Background(), nil, p)
		require.NoError(t, err)
		if resp, ok := out.Response(); ok {
			return resp
		}
		if target, ok := out.JumpTarget(); ok {
			i = slices.Index(names, target)
			require.GreaterOrEqual(t, i, 0, "jump to unknown phase %q", target)
			continue
		}
		require.True(t, out.Continues(), "an outcome is a response, a jump or a continue: %s", out)
		i++
	}
	t.Fatal("the workflow ended without a response")
	return atomicphase.Response{}
}

// TestOutcomeAccessorsAgreeWithRun checks that what the accessors report of
// phase functions' outcomes is what the Runner does with them: the same path
// through the workflow and the same stored (and replayed) response.
func TestOutcomeAccessorsAgreeWithRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf := parcelWorkflow(t)

	for _, express := range []bool{true, false} {
		start := parcel{Express: express}
		byHand := start
		want := follow(t, wf.Phases(), []atomicphase.LocalFunc[parcel]{triage, review, ship}, &byHand)

		params, err := json.Marshal(start)
		require.NoError(t, err)
		key := fmt.Sprintf("express-%t", express)
		req := atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/parcels", Params: params}
		resp, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
		require.Equal(t, want.Status, resp.Status)
		require.Equal(t, want.Body, resp.Body)
		require.Equal(t, want.Header, resp.Header)

		info, err := b.runner.Inspect(b.ctx, "u", key)
		require.NoError(t, err)
		var stored parcel
		require.NoError(t, json.Unmarshal(info.State, &stored))
		require.Equal(t, byHand.Trail, stored.Trail, "the Runner took the path the outcomes describe")

		replay, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		require.Equal(t, want.Header, replay.Header, "the header WithHeader added is stored and replayed")
	}
}
