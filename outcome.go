package atomicphase

import (
	"fmt"
	"net/http"
)

type outcomeKind uint8

const (
	outcomeContinue outcomeKind = iota
	outcomeJump
	outcomeRespond
)

// Outcome tells the Runner where a workflow goes after a phase commits. The
// zero value continues to the next phase.
type Outcome struct {
	kind   outcomeKind
	target string
	resp   Response
}

// Continue returns the outcome that runs the next phase in order.
func Continue() Outcome { return Outcome{} }

// JumpTo returns the outcome that runs the named phase next. The current
// phase must declare the target with WithJumps.
func JumpTo(phase string) Outcome { return Outcome{kind: outcomeJump, target: phase} }

// Respond returns the outcome that finishes the workflow: the response is
// stored in the phase's transaction and replayed, byte for byte, for every
// later request with the same key.
func Respond(status int, body []byte) Outcome {
	return Outcome{kind: outcomeRespond, resp: Response{Status: status, Body: body}}
}

// WithHeader returns a copy of a Respond outcome that also stores and
// replays the header key: value. It has no effect on other outcomes.
func (o Outcome) WithHeader(key, value string) Outcome {
	if o.kind != outcomeRespond {
		return o
	}
	h := o.resp.Header.Clone()
	if h == nil {
		h = make(http.Header)
	}
	h.Add(key, value)
	o.resp.Header = h
	return o
}

// Continues reports whether the outcome runs the next phase in order. With
// JumpTarget and Response it lets a unit test check what a phase function
// returned without running it through a Runner.
func (o Outcome) Continues() bool { return o.kind == outcomeContinue }

// JumpTarget returns the phase a JumpTo outcome runs next, and whether the
// outcome is a jump.
func (o Outcome) JumpTarget() (phase string, ok bool) {
	return o.target, o.kind == outcomeJump
}

// Response returns the response a Respond outcome stores, and whether the
// outcome responds. The returned Response's Header and Body are the
// outcome's own; treat them as read-only.
func (o Outcome) Response() (resp Response, ok bool) {
	return o.resp, o.kind == outcomeRespond
}

// String describes the outcome: "continue", `jump to "NAME"` or
// "respond STATUS".
func (o Outcome) String() string {
	switch o.kind {
	case outcomeJump:
		return fmt.Sprintf("jump to %q", o.target)
	case outcomeRespond:
		return fmt.Sprintf("respond %d", o.resp.Status)
	}
	return "continue"
}

// Response is a workflow's final answer, stored with the key.
type Response struct {
	// Status is the HTTP-style status code the workflow responded with.
	Status int
	// Header holds the headers the workflow marked for replay.
	Header http.Header
	// Body is the response body, replayed byte for byte.
	Body []byte
	// Replayed is true when the response was read back from the store
	// rather than produced by this call.
	Replayed bool
}

// route checks a phase's outcome and says where the workflow goes next and
// what the phase's commit stores.
func (a *attempt) route(idx int, st *step, out Outcome, state []byte) (phaseResult, *checkpoint, error) {
	res := phaseResult{state: state}
	switch out.kind {
	case outcomeRespond:
		if out.resp.Status < 200 || out.resp.Status > 599 {
			return res, nil, Permanent(fmt.Errorf("phase responded with status %d; a final response is 200-599", out.resp.Status))
		}
		if err := a.r.cfg.checkStoredResponse(&out.resp, a.wf.replayable()); err != nil {
			return res, nil, Permanent(err)
		}
		// The response and its checkpoint in one allocation.
		cp := &checkpoint{point: RecoveryPointFinished, respValue: out.resp}
		cp.resp = &cp.respValue
		res.resp = cp.resp
		if a.wf.keepsFinishedState() {
			cp.state = state
		}
		return res, cp, nil
	case outcomeJump:
		for _, t := range st.jumps {
			if t == out.target {
				res.nextIdx, _ = a.wf.resumeAt("", t)
				return res, &checkpoint{point: st.name, pointArg: st.nameArg, jumpTarget: t, state: state}, nil
			}
		}
		return res, nil, Permanent(fmt.Errorf("phase jumped to %q, which it does not declare with WithJumps", out.target))
	default:
		if idx+1 >= len(a.wf.phaseSteps()) {
			return res, nil, Permanent(ErrNoResponse)
		}
		res.nextIdx = idx + 1
		return res, &checkpoint{point: st.name, pointArg: st.nameArg, state: state}, nil
	}
}

// checkStoredResponse checks a response before it is stored: its header
// against the policy (checkStoredHeader), and its size against the
// configured bounds.
func (c *Config) checkStoredResponse(resp *Response, allowed map[string]bool) error {
	if len(resp.Body) > c.MaxResponseBytes {
		return fmt.Errorf("the response body is %d bytes; at most %d may be stored with a key (Config.MaxResponseBytes)", len(resp.Body), c.MaxResponseBytes)
	}
	n := 0
	for name, values := range resp.Header {
		n += len(name) // a name stored with no value still takes room
		for _, v := range values {
			n += len(name) + len(v)
		}
	}
	if n > c.MaxResponseHeaderBytes {
		return fmt.Errorf("the response header is %d bytes; at most %d may be stored with a key (Config.MaxResponseHeaderBytes)", n, c.MaxResponseHeaderBytes)
	}
	return checkStoredHeader(resp.Header, allowed)
}
