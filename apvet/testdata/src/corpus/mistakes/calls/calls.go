// Package calls holds foreign phases with the mistakes a service makes
// around its one call, one per phase: apvet reports each, and nothing
// else.
package calls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase"
	"github.com/hashicorp/go-retryablehttp"
)

type Charge struct {
	Customer string
	Amount   int64
	ChargeID string
	Captured bool
}

// SDK is a payment client apvet does not know.
type SDK interface {
	Charge(ctx context.Context, customer string, amount int64) (string, error)
}

type Payments struct {
	base   string
	client *http.Client
	sdk    SDK
}

func newKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *Payments) Phases() []atomicphase.Phase[Charge] {
	return []atomicphase.Phase[Charge]{
		// A client that retries on its own inside the call.
		atomicphase.Foreign("retrying", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				req, err := retryablehttp.NewRequest("POST", p.base+"/charges", strings.NewReader(key))
				if err != nil {
					return err
				}
				_, err = retryablehttp.NewClient().Do(req) // want `github.com/hashicorp/go-retryablehttp retries requests on its own`
				return err
			})
		}, nil),
		// The call retried by hand.
		atomicphase.Foreign("retry loop", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			var err error
			for range 3 {
				if err = call.Do(ctx, func(ctx context.Context, key string) error { return p.charge(ctx, key, c) }); err == nil { // want `call.Do in a loop`
					return nil
				}
			}
			return err
		}, nil),
		// The request retried by hand inside the call.
		atomicphase.Foreign("retry loop inside", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				var err error
				for range 3 {
					if err = p.charge(ctx, key, c); err == nil { // want `a request in a loop inside call.Do`
						return nil
					}
				}
				return err
			})
		}, nil),
		// Charge, then capture, in one phase.
		atomicphase.Foreign("charge and capture", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			if err := call.Do(ctx, func(ctx context.Context, key string) error { return p.charge(ctx, key, c) }); err != nil {
				return err
			}
			return call.Do(ctx, func(ctx context.Context, key string) error { // want `a second call.Do on the same path of a foreign phase`
				return p.capture(ctx, key, c)
			})
		}, nil),
		// A client apvet does not know, and the key never handed to it.
		atomicphase.Foreign("sdk", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			return call.Do(ctx, func(ctx context.Context, _ string) error { // want `call.Do's function ignores the downstream key it is handed`
				id, err := p.sdk.Charge(ctx, c.Customer, c.Amount)
				c.ChargeID = id
				return err
			})
		}, nil),
		// A fresh key on every attempt.
		atomicphase.Foreign("fresh key", func(ctx context.Context, call *atomicphase.ForeignCall, c *Charge) error {
			return call.Do(ctx, func(ctx context.Context, _ string) error {
				return p.charge(ctx, newKey(), c) // want `p.charge \(which calls \(\*http.Client\).Do\) inside call.Do is not given the downstream key`
			})
		}, nil),
		// The charge made by a method the local phase calls.
		atomicphase.Local("charge in a local phase", func(ctx context.Context, tx atomicphase.Tx, c *Charge) (atomicphase.Outcome, error) {
			if err := p.charge(ctx, "order-"+c.Customer, c); err != nil { // want `p.charge \(which calls \(\*http.Client\).Do\) in a local phase`
				return atomicphase.Outcome{}, err
			}
			tx.Queue(`UPDATE orders SET charge_id = $1`, c.ChargeID)
			return atomicphase.Continue(), nil
		}),
	}
}

func (p *Payments) charge(ctx context.Context, key string, c *Charge) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/charges", strings.NewReader(c.Customer))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	c.ChargeID = resp.Header.Get("Charge-Id")
	return nil
}

func (p *Payments) capture(ctx context.Context, key string, c *Charge) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/charges/"+c.ChargeID+"/capture", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	c.Captured = resp.StatusCode == http.StatusOK
	return resp.Body.Close()
}
