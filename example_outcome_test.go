package atomicphase_test

import (
	"context"
	"fmt"

	"github.com/atomicphase/atomicphase"
)

type shipment struct {
	Weight int  `json:"weight"`
	Rush   bool `json:"rush"`
}

// ExampleOutcome unit-tests a phase function: one that decides from the
// state alone can be called directly, with a nil tx and no database, and its
// Outcome asked where the workflow goes next.
func ExampleOutcome() {
	route := func(_ context.Context, _ atomicphase.Tx, s *shipment) (atomicphase.Outcome, error) {
		switch {
		case s.Weight > 1000:
			return atomicphase.Respond(422, []byte(`{"error":"too heavy"}`)), nil
		case s.Rush:
			return atomicphase.JumpTo("dispatch"), nil
		}
		return atomicphase.Continue(), nil
	}

	for _, s := range []shipment{{Weight: 5}, {Weight: 5, Rush: true}, {Weight: 5000}} {
		out, err := route(context.Background(), nil, &s)
		if err != nil {
			panic(err)
		}
		if phase, ok := out.JumpTarget(); ok {
			fmt.Printf("%+v: jumps to %s\n", s, phase)
		} else if resp, ok := out.Response(); ok {
			fmt.Printf("%+v: responds %d %s\n", s, resp.Status, resp.Body)
		} else if out.Continues() {
			fmt.Printf("%+v: %s\n", s, out)
		}
	}
	// Output:
	// {Weight:5 Rush:false}: continue
	// {Weight:5 Rush:true}: jumps to dispatch
	// {Weight:5000 Rush:false}: responds 422 {"error":"too heavy"}
}
