// Command server is the smallest server a user writes with atomicphase,
// aphttp and faultinject. TestServerLinksNoTestMachinery lists what it
// links: nothing of testing or Docker may be among it.
package main

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/faultinject"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	faults, err := faultinject.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{FaultInjector: &faultinject.ContextInjector{Base: faults}})
	if err != nil {
		log.Fatal(err)
	}
	hello := atomicphase.MustWorkflow("hello", []atomicphase.Phase[struct{}]{
		atomicphase.Local("respond", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(http.StatusCreated, []byte(`{"hello":"world"}`)), nil
		}),
	}, nil)
	mw := aphttp.Middleware(runner, hello, &aphttp.Options{Scope: func(r *http.Request) (string, error) { return "user", nil }})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", faultinject.HeaderMiddleware(pool, mw(http.NotFoundHandler()))))
}
