package apcitus_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apcitus"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// ExampleNewRouter wires a Runner the way a service that may run on
// Citus or on plain PostgreSQL does: with a Router when the key table is
// distributed, and without one (every statement through the pool) when
// NewRouter answers ErrNotDistributed. The request is answered the same
// either way: routing changes where statements go, never what they do.
func ExampleNewRouter() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, nil) // a migrated database of its own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	cfg := &atomicphase.Config{}
	router, err := apcitus.NewRouter(ctx, db.Pool, nil)
	switch {
	case errors.Is(err, apcitus.ErrNotDistributed):
		// Plain PostgreSQL, or a key table left local: no routing.
	case err != nil:
		log.Fatal(err)
	default:
		defer router.Close()
		cfg.Router = router
	}
	runner, err := atomicphase.NewRunner(db.Pool, cfg)
	if err != nil {
		log.Fatal(err)
	}

	type greeting struct{ Name string }
	hello := atomicphase.MustWorkflow("hello", func(in greeting, _ *atomicphase.Request) (greeting, error) { return in, nil },
		[]atomicphase.Phase[greeting]{
			atomicphase.Local("greet", func(ctx context.Context, tx atomicphase.Tx, g *greeting) (atomicphase.Outcome, error) {
				return atomicphase.Respond(200, []byte("hello, "+g.Name)), nil
			}),
		}, nil)
	req := atomicphase.Request{Scope: "tenant-7", Key: "k-1", Method: "POST", Path: "/hello", Params: []byte(`{"Name": "Ada"}`)}
	for range 2 {
		resp, err := runner.Run(ctx, hello, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d %s (replayed: %t)\n", resp.Status, resp.Body, resp.Replayed)
	}
	// Output:
	// 200 hello, Ada (replayed: false)
	// 200 hello, Ada (replayed: true)
}
