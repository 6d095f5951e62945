package apotel

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/atomicphase/atomicphase"
)

// The attribute keys. Metrics carry only AttrWorkflow, AttrPhase and
// AttrOutcome, whose values a deployment has a handful of; spans and span
// events carry the rest too.
const (
	// AttrWorkflow is the workflow's name.
	AttrWorkflow attribute.Key = "workflow"
	// AttrPhase is the phase's name, on phase metrics and spans and on the
	// events that concern a phase.
	AttrPhase attribute.Key = "phase"
	// AttrOutcome is "committed" or "failed", on the phase duration
	// histogram.
	AttrOutcome attribute.Key = "outcome"
	// AttrScope is the key's scope as Config.RedactKey left it, on spans
	// and span events when Options.RecordKeys is set.
	AttrScope attribute.Key = "scope"
	// AttrKey is the idempotency key as Config.RedactKey left it, on spans
	// and span events when Options.RecordKeys is set.
	AttrKey attribute.Key = "key"
	// AttrCount is Event.Count, on span events about many keys at once.
	AttrCount attribute.Key = "count"
	// AttrDuration is Event.Duration in seconds, on phase span events.
	AttrDuration attribute.Key = "duration_seconds"
	// AttrError is Event.Err's text, on span events of failures.
	AttrError attribute.Key = "error"
)

// appendMetricAttrs appends e's metric attributes: its workflow and phase,
// when it has them.
func appendMetricAttrs(attrs []attribute.KeyValue, e atomicphase.Event) []attribute.KeyValue {
	if e.Workflow != "" {
		attrs = append(attrs, AttrWorkflow.String(e.Workflow))
	}
	if e.Phase != "" {
		attrs = append(attrs, AttrPhase.String(e.Phase))
	}
	return attrs
}

// spanAttrs returns the attributes a span of s starts with.
func (o *Observer) spanAttrs(s atomicphase.Span) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4)
	if s.Workflow != "" {
		attrs = append(attrs, AttrWorkflow.String(s.Workflow))
	}
	if s.Phase != "" {
		attrs = append(attrs, AttrPhase.String(s.Phase))
	}
	return o.appendKeyAttrs(attrs, s.Scope, s.Key)
}

// eventAttrs returns the attributes of e's span event: whatever e says.
func (o *Observer) eventAttrs(e atomicphase.Event) []attribute.KeyValue {
	attrs := appendMetricAttrs(make([]attribute.KeyValue, 0, 7), e)
	attrs = o.appendKeyAttrs(attrs, e.Scope, e.Key)
	if e.Count > 0 {
		attrs = append(attrs, AttrCount.Int(e.Count))
	}
	if e.Duration > 0 {
		attrs = append(attrs, AttrDuration.Float64(e.Duration.Seconds()))
	}
	if e.Err != nil {
		attrs = append(attrs, AttrError.String(e.Err.Error()))
	}
	return attrs
}

// appendKeyAttrs appends the scope and key if Options.RecordKeys asked for
// them.
func (o *Observer) appendKeyAttrs(attrs []attribute.KeyValue, scope, key string) []attribute.KeyValue {
	if !o.recordKeys {
		return attrs
	}
	if scope != "" {
		attrs = append(attrs, AttrScope.String(scope))
	}
	if key != "" {
		attrs = append(attrs, AttrKey.String(key))
	}
	return attrs
}
