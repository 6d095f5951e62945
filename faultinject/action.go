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
	// Exit kills the whole process with SIGKILL at the point.
	Exit Action = "exit"
)

// Actions lists every action, in a stable order.
var Actions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck, Exit}

// InProcessActions are the actions an in-process explorer can survive
// (every one but Exit).
var InProcessActions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck}

// ErrInjected is wrapped by the error the Error action returns.
var ErrInjected = errors.New("faultinject: injected error")

// InjectedPanic is the value the Panic action panics with.
type InjectedPanic struct{ At atomicphase.FaultPoint }

// String names the point the panic was injected at.
func (p *InjectedPanic) String() string { return "faultinject: injected panic at " + p.At.String() }
