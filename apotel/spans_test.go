package apotel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apotel"
)

// TestSpansRecordKeysOnlyWhenAsked runs a request whose charge fails, its
// completion by the sweep, and checks every span and span event: no scope
// or key unless Options.RecordKeys, then as Config.RedactKey left them;
// and never a scope or key on a metric.
func TestSpansRecordKeysOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:6])
	}
	redact := func(scope, key string) (string, string) { return "scope-" + hash(scope), "key-" + hash(key) }
	for _, tc := range []struct {
		name      string
		record    bool
		redact    func(scope, key string) (string, string)
		wantScope string // "" for no scope or key attributes at all
		wantKey   string
	}{
		{name: "default"},
		{name: "default, redacted", redact: redact},
		{name: "recorded", record: true, wantScope: "user_7", wantKey: "order-42"},
		{name: "recorded, redacted", record: true, redact: redact, wantScope: "scope-" + hash("user_7"), wantKey: "key-" + hash("order-42")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &apotel.Options{RecordKeys: tc.record},
				&atomicphase.Config{RedactKey: tc.redact, AttemptBackoff: time.Millisecond})
			wf := b.orderWorkflow(t)
			b.charges.then("order-42", fail(errors.New("card network timeout")))
			b.step("run", func(ctx context.Context) {
				_, err := b.runner.Run(ctx, wf, order("user_7", "order-42", "rocket"))
				require.ErrorContains(t, err, "card network timeout")
			})
			sweeper, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{Retention: -1})
			require.NoError(t, err)
			b.step("sweep", func(ctx context.Context) {
				res, err := sweeper.RunOnce(ctx)
				require.NoError(t, err)
				require.Equal(t, 1, res.Completed)
			})

			tree := newSpanTree(b.spans)
			// Two requests (the Run, the sweep's Resume) of two phase runs
			// each, and the test's two steps.
			require.Len(t, tree.all, 2+4+2)
			events := 0
			for _, s := range tree.all {
				ours := s.Name() == apotel.RequestSpanName || strings.HasPrefix(s.Name(), apotel.PhaseSpanPrefix)
				require.Equal(t, ours, s.InstrumentationScope().Name == "github.com/atomicphase/atomicphase/apotel", s.Name())
				if ours {
					requireKeys(t, attrs(s.Attributes()), tc.wantScope, tc.wantKey, "span "+s.Name())
				}
				for _, e := range s.Events() {
					if e.Name == "exception" {
						continue
					}
					events++
					require.True(t, strings.HasPrefix(e.Name, apotel.MetricPrefix), e.Name)
					requireKeys(t, attrs(e.Attributes), tc.wantScope, tc.wantKey, "event "+e.Name+" on "+s.Name())
				}
			}
			// created, committed, failed; failed_retry, committed, committed;
			// zombie_key on the sweep's span.
			require.Equal(t, 7, events)
			zombie := tree.named(t, "sweep").Events()
			require.Len(t, zombie, 1)
			require.Equal(t, ev(atomicphase.EventZombieKey), zombie[0].Name)

			for name, points := range collect(t, b.reader) {
				for set := range points {
					require.NotContains(t, set, "scope=", name)
					require.NotContains(t, set, "key=", name)
				}
			}
		})
	}
}

// requireKeys checks that the attributes of what have the scope and key
// wanted, or neither when wantScope is "".
func requireKeys(t *testing.T, attrs map[string]string, wantScope, wantKey, what string) {
	t.Helper()
	if wantScope == "" {
		require.NotContains(t, attrs, "scope", what)
		require.NotContains(t, attrs, "key", what)
		return
	}
	require.Equal(t, wantScope, attrs["scope"], what)
	require.Equal(t, wantKey, attrs["key"], what)
}

// TestSpanEventsGoToTheInnermostOpenSpan drives the Observer by hand: an
// event during a phase goes to the phase's span, one after the phase's span
// ended to the request's, which learns its workflow from the first event
// that names it; a span of a kind added later is named after the kind.
func TestSpanEventsGoToTheInnermostOpenSpan(t *testing.T) {
	t.Parallel()
	obs, _, rec := newObserver(t, nil)
	ctx := context.Background()

	reqCtx, endReq := obs.StartSpan(ctx, atomicphase.Span{Kind: atomicphase.SpanRequest, Scope: "s", Key: "k"})
	obs.Observe(reqCtx, atomicphase.Event{Kind: atomicphase.EventFailedRetry, Workflow: "order"})
	phaseCtx, endPhase := obs.StartSpan(reqCtx, atomicphase.Span{Kind: atomicphase.SpanPhase, Workflow: "order", Phase: "charge"})
	obs.Observe(phaseCtx, atomicphase.Event{Kind: "phase.retried", Workflow: "order", Phase: "charge"})
	otherCtx, endOther := obs.StartSpan(phaseCtx, atomicphase.Span{Kind: "reconcile", Workflow: "order"})
	endOther(nil)
	endPhase(errors.New("declined"))
	obs.Observe(otherCtx, atomicphase.Event{Kind: atomicphase.EventPhaseFailed, Workflow: "order", Phase: "charge",
		Duration: 1500 * time.Millisecond, Err: errors.New("declined")})
	endReq(errors.New("declined"))

	tree := newSpanTree(rec)
	req := tree.named(t, apotel.RequestSpanName)
	require.Equal(t, map[string]string{"workflow": "order"}, attrs(req.Attributes()))
	require.Equal(t, []string{ev(atomicphase.EventFailedRetry), ev(atomicphase.EventPhaseFailed), "exception"}, eventNames(req))
	require.Equal(t, map[string]string{"workflow": "order", "phase": "charge", "duration_seconds": "1.5", "error": "declined"},
		attrs(req.Events()[1].Attributes))
	require.Equal(t, codes.Error, req.Status().Code)
	require.Equal(t, "declined", req.Status().Description)

	phase := tree.named(t, apotel.PhaseSpanPrefix+"charge")
	require.Equal(t, req.SpanContext().SpanID(), phase.Parent().SpanID())
	require.Equal(t, []string{"atomicphase.phase.retried", "exception"}, eventNames(phase))
	require.Equal(t, codes.Error, phase.Status().Code)

	other := tree.named(t, "atomicphase.reconcile")
	require.Equal(t, phase.SpanContext().SpanID(), other.Parent().SpanID())
	require.Equal(t, codes.Unset, other.Status().Code)
	require.Empty(t, other.Events())
}

// Config.RedactError is the one hook error text goes through: a failed
// phase's text reaches none of the five places a span keeps it (the phase
// span's status and exception.message, the phase.failed event's error
// attribute, the request span's status and exception.message) but
// rewritten.
func TestSpansCarryOnlyRedactedErrorText(t *testing.T) {
	t.Parallel()
	const card = "4242424242424242"
	b := setup(t, nil, &atomicphase.Config{AttemptBackoff: time.Millisecond,
		RedactError: func(msg string) string { return strings.ReplaceAll(msg, card, "[card]") }})
	wf := b.orderWorkflow(t)
	b.charges.then("order-42", fail(errors.New("card "+card+" declined")))
	b.step("run", func(ctx context.Context) {
		_, err := b.runner.Run(ctx, wf, order("user_7", "order-42", "rocket"))
		require.ErrorContains(t, err, card, "the caller gets the error as it was")
	})

	tree := newSpanTree(b.spans)
	var places []string
	for _, s := range []sdktrace.ReadOnlySpan{tree.named(t, apotel.PhaseSpanPrefix+"charge"), tree.named(t, apotel.RequestSpanName)} {
		require.Equal(t, codes.Error, s.Status().Code, s.Name())
		places = append(places, s.Status().Description)
		for _, e := range s.Events() {
			a := attrs(e.Attributes)
			switch e.Name {
			case "exception":
				places = append(places, a["exception.message"])
			case ev(atomicphase.EventPhaseFailed):
				places = append(places, a[string(apotel.AttrError)])
			}
		}
	}
	require.Len(t, places, 5)
	for _, p := range places {
		require.Contains(t, p, "card [card] declined")
		require.NotContains(t, p, card)
	}
}
