package broken

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/atomicphase/atomicphase"
)

func callPhases(base string, client *http.Client) []atomicphase.Phase[Ride] {
	return []atomicphase.Phase[Ride]{
		// The request is sent from a goroutine: it can still be in flight
		// after Do returned.
		atomicphase.Foreign("request from a goroutine", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				go charge(ctx, base, key) // want `a request sent from a goroutine inside call.Do`
				return nil
			})
		}, nil),
		atomicphase.Foreign("request from a waitgroup", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				var wg sync.WaitGroup
				wg.Go(func() { _ = charge(ctx, base, key) }) // want `a request sent from a goroutine inside call.Do`
				return nil
			})
		}, nil),
		// call.Key is mentioned, but not sent by the call Do makes.
		atomicphase.Foreign("key mentioned elsewhere", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			r.Ref = call.Key()
			return call.Do(ctx, func(ctx context.Context, _ string) error {
				req, err := http.NewRequestWithContext(ctx, "POST", base+"/charges", strings.NewReader(`{"amount": 100}`))
				if err != nil {
					return err
				}
				_, err = client.Do(req) // want `\(\*http.Client\).Do inside call.Do is not given the downstream key`
				return err
			})
		}, nil),
		// The key is at hand but the helper that sends is given another.
		atomicphase.Foreign("helper given another key", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				r.Ref = key
				return charge(ctx, base, "charge-"+r.Name) // want `charge \(which calls \(\*http.Client\).Do\) inside call.Do is not given the downstream key`
			})
		}, nil),
		// A debit and a credit through a plain client: a retry after the
		// debit went out sends both again.
		atomicphase.Foreign("two requests in one call", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				if err := transfer(ctx, client, base+"/debit", key); err != nil {
					return err
				}
				return transfer(ctx, client, base+"/credit", key) // want `a second request inside one call.Do, transfer \(which calls \(\*http.Client\).Do\) \(the first at calls.go:53:15\)`
			})
		}, nil),
		atomicphase.Foreign("requests in a loop", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				var err error
				for range 3 {
					if err = transfer(ctx, client, base+"/debit", key); err == nil { // want `a request in a loop inside call.Do`
						return nil
					}
				}
				return err
			})
		}, nil),
		// Handing call to fmt guards nothing: the request outside Do is
		// still unguarded.
		atomicphase.Foreign("call printed", func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
			r.Name = fmt.Sprint(call)
			_, err := client.Get(base + "/ping") // want `\(\*http.Client\).Get in a foreign phase outside call.Do`
			return err
		}, nil),
	}
}

func transfer(ctx context.Context, client *http.Client, url, key string) error {
	req, err := http.NewRequestWithContext(ctx, "POST", url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
