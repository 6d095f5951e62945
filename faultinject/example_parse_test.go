package faultinject_test

import (
	"fmt"

	"github.com/atomicphase/atomicphase/faultinject"
)

// A server reads its faults from ATOMICPHASE_FAULTS with FromEnv, which
// parses the value like this. Each rule names a phase (optionally behind its
// workflow), a place and an action; a malformed value is an error naming the
// rule and the valid choices, to stop the server at start-up.
func ExampleParse() {
	rules, err := faultinject.Parse("charge:after-foreign:exit, create_ride/create_ride:before-commit:delay:2s, *:after-acquire:crash")
	if err != nil {
		panic(err)
	}
	for _, r := range rules {
		fmt.Printf("workflow=%q phase=%q place=%s action=%s delay=%s\n", r.Workflow, r.Phase, r.Place, r.Action, r.Delay)
	}

	_, err = faultinject.Parse("charge:after-foreign:explode")
	fmt.Println(err)
	// Output:
	// workflow="" phase="charge" place=after-foreign action=exit delay=0s
	// workflow="create_ride" phase="create_ride" place=before-commit action=delay delay=2s
	// workflow="" phase="" place=after-acquire action=crash delay=0s
	// faultinject: ATOMICPHASE_FAULTS: want [WORKFLOW/]PHASE:PLACE:ACTION[:ARG]: "charge:after-foreign:explode": unknown action "explode" (one of crash, error, panic, delay, terminate-backend, lose-commit-ack, lose-take-ack, slow-call, drop-after-request, exit)
}
