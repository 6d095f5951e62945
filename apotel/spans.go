package apotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase"
)

// The span names. A phase span's name ends with the phase's name, which is
// also its AttrPhase attribute.
const (
	RequestSpanName = "atomicphase.request"
	PhaseSpanPrefix = "atomicphase.phase "
)

// DiscardedEventName is the event on a phase span whose phase ran ahead of
// its key's read on a request not marked as a retry, and whose key was
// another request's (a finished key's replay, say): nothing of the phase was
// kept (atomicphase.ErrDiscarded).
const DiscardedEventName = "atomicphase.phase.discarded"

// openSpan is a span this Observer started and the one it was started
// under, as the context of the code inside it carries them: Observe walks
// them to find where an event goes.
type openSpan struct {
	span     trace.Span
	kind     atomicphase.SpanKind
	workflow string // as the span started; "" for a Resume's request span
	outer    *openSpan
}

type openSpanKey struct{}

// StartSpan starts the span of a request (RequestSpanName) or of a phase
// (PhaseSpanPrefix + phase name) under the span ctx carries, and returns the
// context that carries it and the function that ends it. Ending it with an
// error records the error on the span and sets the span's status to Error;
// a phase span ended with atomicphase.ErrDiscarded (the phase ran ahead of
// its key's read, and the key was another request's) gets the event
// DiscardedEventName instead, its status unset.
func (o *Observer) StartSpan(ctx context.Context, s atomicphase.Span) (context.Context, func(error)) {
	name := MetricPrefix + string(s.Kind)
	switch s.Kind {
	case atomicphase.SpanRequest:
		name = RequestSpanName
	case atomicphase.SpanPhase:
		name = PhaseSpanPrefix + s.Phase
	}
	ctx, span := o.tracer.Start(ctx, name, trace.WithAttributes(o.spanAttrs(s)...))
	outer, _ := ctx.Value(openSpanKey{}).(*openSpan)
	ctx = context.WithValue(ctx, openSpanKey{}, &openSpan{span: span, kind: s.Kind, workflow: s.Workflow, outer: outer})
	return ctx, func(err error) {
		if errors.Is(err, atomicphase.ErrDiscarded) {
			// The phase ran ahead of its key's read and the key was
			// another request's: not a failure, and nothing was kept.
			span.AddEvent(DiscardedEventName)
			span.End()
			return
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// addEvent adds e, named MetricPrefix + its kind, to the innermost span of
// this Observer in ctx that is still open: the phase span, or the request
// span for events that come after their phase's span ended (a phase's own
// committed or failed event among them). Outside a request (a sweep's
// zombie_key, ttl_pruned and sweep.unknown_workflow events), it goes to the
// span ctx carries, if that records.
//
// A Resume's request span starts before the key, and so the workflow, is
// known; the first event that names the workflow adds it to the span.
func (o *Observer) addEvent(ctx context.Context, e atomicphase.Event) {
	var target trace.Span
	for s, _ := ctx.Value(openSpanKey{}).(*openSpan); s != nil; s = s.outer {
		if !s.span.IsRecording() {
			continue
		}
		if target == nil {
			target = s.span
		}
		if s.kind == atomicphase.SpanRequest {
			if s.workflow == "" && e.Workflow != "" {
				s.span.SetAttributes(AttrWorkflow.String(e.Workflow))
			}
			break
		}
	}
	if target == nil {
		if target = trace.SpanFromContext(ctx); !target.IsRecording() {
			return
		}
	}
	target.AddEvent(MetricPrefix+string(e.Kind), trace.WithAttributes(o.eventAttrs(e)...))
}
