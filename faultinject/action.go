package faultinject

import (
	"errors"

	"github.com/atomicphase/atomicphase"
)

// Action is what an Injector does at a matching fault point.
type Action string

// The actions.
const (
	// Crash stops the attempt dead, as a killed process would: its
	// connection is closed without commit, rollback or unlock, and Run
	// returns atomicphase.ErrCrashed. The key stays locked until the lock
	// timeout.
	Crash Action = "crash"
	// Error returns a transient error: the phase rolls back and the key is
	// unlocked.
	Error Action = "error"
	// Panic panics with an *InjectedPanic value; the Runner unlocks and re-panics.
	Panic Action = "panic"
	// Delay sleeps for Rule.Delay (default 10ms), for races and
	// lock-timeout tests.
	Delay Action = "delay"
	// TerminateBackend kills the connection's PostgreSQL backend from
	// another connection (pg_terminate_backend), so the driver meets a real
	// broken connection on its next statement. Only points where the
	// attempt holds a connection have a backend to kill.
	TerminateBackend Action = "terminate-backend"
	// LoseCommitAck lets the phase's COMMIT reach the server and complete,
	// then breaks the connection before the client reads the
	// acknowledgement: the ambiguous commit. It applies at BeforeCommit and
	// needs connections dialed through InstallDialer.
	LoseCommitAck Action = "lose-commit-ack"
	// LoseTakeAck lets the statement that records or takes the key (the
	// acquisition of a key that is not recorded with its first phase, the
	// sweep's or Resume's take) reach the server and complete, then breaks
	// the connection before the client reads the answer: the key may be
	// locked with nobody to run it. It applies at BeforeAcquire where the
	// attempt holds the connection that sends that statement, and needs
	// connections dialed through InstallDialer.
	LoseTakeAck Action = "lose-take-ack"
	// SlowCall makes a foreign call's answer late: at AfterForeign, where
	// the call has returned and its lease still runs, it sleeps Rule.Delay
	// (default 1s) under the call's context, as a downstream slower than
	// the lease would. The attempt renews its lease meanwhile; when it
	// cannot, the sleep ends with the lease's context and the attempt
	// commits nothing. Make Delay longer than Config.LockTimeout to try the
	// renewal (the explorer does, on a lease it shortens).
	SlowCall Action = "slow-call"
	// DropAfterRequest breaks the next HTTP connection that sends a request
	// through HTTP.Transport once the server has read the request and
	// answered: the client reads no answer, as when a server or proxy
	// closes a kept-alive connection after reading a request. A client
	// that re-sent the request on its own (net/http does, for a request it
	// believes replayable) would send a foreign call twice. It applies at
	// BeforePhase, before the phase's requests go out, and needs
	// Injector.HTTP.
	DropAfterRequest Action = "drop-after-request"
	// Exit kills the whole process with SIGKILL at the point.
	Exit Action = "exit"
)

// Actions lists every action, in a stable order.
var Actions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck, LoseTakeAck, SlowCall, DropAfterRequest, Exit}

// InProcessActions are the actions an in-process explorer can survive
// (every one but Exit).
var InProcessActions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck, LoseTakeAck, SlowCall, DropAfterRequest}

// NeedsConn reports whether a acts on the connection the attempt holds at
// the point: a rule with such an action does not fire where the attempt
// holds none, and waits for a pass of its point that holds one.
func (a Action) NeedsConn() bool {
	return a == TerminateBackend || a == LoseCommitAck || a == LoseTakeAck
}

// ErrInjected is wrapped by the error the Error action returns.
var ErrInjected = errors.New("faultinject: injected error")

// InjectedPanic is the value the Panic action panics with.
type InjectedPanic struct{ At atomicphase.FaultPoint }

// String names the point the panic was injected at.
func (p *InjectedPanic) String() string { return "faultinject: injected panic at " + p.At.String() }
