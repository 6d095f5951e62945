// Package faultinject kills atomicphase runs at named fault points, in
// process and as a real process kill, so tests and test drivers can prove a
// workflow correct under every crash.
//
// A Runner passes fault points (atomicphase.FaultPoint) at fixed places:
// before and after the key is acquired, before each phase's body, after a
// foreign call returned, before the commit that stores the response, before
// each commit, and after it. An Injector set as Config.FaultInjector acts on
// the points its rules match:
//
//	inj := faultinject.New(faultinject.Rule{
//		Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Crash,
//	})
//	runner, _ := atomicphase.NewRunner(pool, &atomicphase.Config{FaultInjector: inj})
//
// For a server under an external test driver, FromEnv reads rules from
// ATOMICPHASE_FAULTS (see Parse), so `charge:after-foreign:exit` SIGKILLs the
// process right after the charge phase's foreign call returned;
// ContextInjector and HeaderMiddleware choose the fault per request.
// InstallDialer wraps the pool's connections so a commit's acknowledgement
// can be lost.
//
// These are the runtime pieces, safe to link into a server: the package
// imports no test machinery, and a nil *Injector (what FromEnv returns when
// the variable is unset) costs one nil check per fault point. The explorer,
// which runs a workflow through every point × action and checks its
// invariants, is test support: atomicphasetest.Explore.
package faultinject
