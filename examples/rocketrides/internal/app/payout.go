package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase"
)

// Driver payouts go through a legacy bank API with no idempotency keys:
// every POST /payouts it takes is a payout. The payout phase therefore
// sends its call at most once unless the bank's lookup has shown that no
// payout exists for the ride's reference (WithReconcile): a call that
// failed in a way that may have paid (a connection error, a timeout, a 5xx)
// leaves the outcome unknown, and the request waits (409 to a retry) until
// the lookup tells.

// The payout every ride makes to its driver.
const (
	DriverAccount = "acct_driver_1"
	PayoutAmount  = 1500
)

// payoutTimeout bounds a payout call and a lookup. A payout call that times
// out may have paid: its outcome is unknown, and reconciled.
const payoutTimeout = 10 * time.Second

// bankPayout is a payout as the bank lists it.
type bankPayout struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
}

// PayoutReference is the reference a ride's payout is sent and looked up
// with: the payout phase's downstream key, which is identical on every
// retry of the request, distinct across users, and new when a reaped key is
// reused.
func PayoutReference(call *atomicphase.ForeignCall) string { return call.Key() }

// payoutFunc pays the ride's driver at the bank at base, once. A 201 records
// the payout; a 4xx is a refusal: the bank answered, definitively, and
// nothing was paid. It is the request's answer, not a failure: the call
// records the refusal in the state, and the record step ends the request
// with a stored 424 (see recordPayout), as a declined card ends it with a
// stored 402. Anything else is returned as an error, which the Runner turns
// into an unknown outcome.
func payoutFunc(base string, client *http.Client) atomicphase.CallFunc[Ride] {
	return func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
		return call.Do(ctx, func(ctx context.Context, _ string) error {
			body, err := json.Marshal(map[string]any{
				"reference": PayoutReference(call), "account": DriverAccount, "amount": PayoutAmount, "currency": Currency,
			})
			if err != nil {
				return atomicphase.Permanent(err)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payouts", bytes.NewReader(body))
			if err != nil {
				return atomicphase.Permanent(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("payout: %w", err)
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			switch {
			case resp.StatusCode >= 400 && resp.StatusCode < 500:
				r.PayoutRefused = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(data))
				return nil
			case resp.StatusCode != http.StatusCreated:
				return fmt.Errorf("payout: the bank answered %s", resp.Status)
			case err != nil:
				return fmt.Errorf("payout: reading the bank's answer: %w", err)
			}
			var p bankPayout
			if err := json.Unmarshal(data, &p); err != nil || !strings.HasPrefix(p.ID, "po_") {
				// Paid, but we cannot say which payout: the lookup will.
				return fmt.Errorf("payout: a 201 without a payout id: %s", data)
			}
			r.PayoutID = p.ID
			return nil
		})
	}
}

// reconcilePayout asks the bank whether the ride's payout was made: the
// lookup by reference is authoritative. A payout found is recorded as the
// call would have; none means the payout may be sent; a failed lookup
// leaves the outcome unknown.
func reconcilePayout(base string, client *http.Client) atomicphase.ReconcileFunc[Ride] {
	return func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			base+"/payouts?reference="+url.QueryEscape(PayoutReference(call)), nil)
		if err != nil {
			return false, atomicphase.Permanent(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, fmt.Errorf("payout lookup: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("payout lookup: the bank answered %s", resp.Status)
		}
		var list struct {
			Data *[]bankPayout `json:"data"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || list.Data == nil {
			return false, fmt.Errorf("payout lookup: an answer without data (%v)", err)
		}
		if len(*list.Data) == 0 {
			return false, nil
		}
		r.PayoutID = (*list.Data)[0].ID
		return true, nil
	}
}

// recordPayout records the payout, or ends the request with the bank's
// refusal: 424 Failed Dependency, stored and replayed (a retry with the
// same key gets the same answer and sends nothing; the rider's charge
// stands, recorded on the ride, for an operator to refund or pay by hand).
// A 4xx: the request as sent will not succeed, so a client must not retry
// it in a loop, as it would a 5xx.
func recordPayout(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	if r.PayoutRefused != "" {
		body, err := json.Marshal(map[string]any{"error": map[string]any{
			"type": "payout_refused", "message": r.PayoutRefused, "ride_id": r.RideID, "charge_id": r.ChargeID}})
		return atomicphase.Respond(http.StatusFailedDependency, body), err
	}
	tx.Queue(`UPDATE rides SET bank_payout_id = $1 WHERE rider = $2 AND id = $3`, r.PayoutID, r.Email, r.RideID)
	return atomicphase.Continue(), nil
}

// payoutPhase is the workflow's payout phase against the bank at base, over
// transport (http.DefaultTransport when nil).
func payoutPhase(base string, transport http.RoundTripper) atomicphase.Phase[Ride] {
	client := payoutClient(transport)
	return atomicphase.Foreign("payout", payoutFunc(base, client), recordPayout).
		WithReconcile(reconcilePayout(base, client))
}

// payoutClient is the bank's HTTP client over transport
// (http.DefaultTransport when nil).
func payoutClient(transport http.RoundTripper) *http.Client {
	return &http.Client{Transport: transport, Timeout: payoutTimeout}
}
