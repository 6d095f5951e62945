package apui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apui"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// ExampleNewHandler mounts the console under /console and uses its JSON
// API as an operator would: a request failed permanently and its key was
// parked; once the bug is fixed, the operator looks the key up and unparks
// it, and the client's next retry runs it to its answer.
func ExampleNewHandler() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, nil) // a migrated database of its own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	var fixed atomic.Bool // the bug, until a deploy fixes it
	type order struct{ Item string }
	place := atomicphase.MustWorkflow("place_order", func(in order, _ *atomicphase.Request) (order, error) { return in, nil },
		[]atomicphase.Phase[order]{
			atomicphase.Local("place", func(ctx context.Context, tx atomicphase.Tx, o *order) (atomicphase.Outcome, error) {
				if !fixed.Load() {
					return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("no price for " + o.Item))
				}
				return atomicphase.Respond(201, []byte(`{"placed": "`+o.Item+`"}`)), nil
			}),
		}, nil)
	req := atomicphase.Request{Scope: "shop-1", Key: "order-9", Method: "POST", Path: "/orders", Params: []byte(`{"Item": "boots"}`)}
	_, err = runner.Run(ctx, place, req)
	fmt.Println("first attempt:", errors.Is(err, atomicphase.ErrPermanent))

	console, err := apui.NewHandler(&apui.Options{Runner: runner, Prefix: "/console"})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", console) // behind the service's own operator authentication
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/console/api/key?scope=shop-1&key=order-9")
	if err != nil {
		log.Fatal(err)
	}
	var key atomicphase.KeyInfo
	if err := json.NewDecoder(resp.Body).Decode(&key); err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("the console shows:", key.Status, "-", *key.LastError)

	fixed.Store(true)
	resp, err = http.Post(srv.URL+"/console/api/key/unpark", "application/json", strings.NewReader(`{"scope": "shop-1", "key": "order-9"}`))
	if err != nil {
		log.Fatal(err)
	}
	var done struct{ Done string }
	if err := json.NewDecoder(resp.Body).Decode(&done); err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("the operator:", resp.StatusCode, done.Done)

	answer, err := runner.Run(ctx, place, req) // the client's retry
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry:", answer.Status, string(answer.Body))
	// Output:
	// first attempt: true
	// the console shows: parked - phase "place": no price for boots
	// the operator: 200 unparked
	// retry: 201 {"placed": "boots"}
}
