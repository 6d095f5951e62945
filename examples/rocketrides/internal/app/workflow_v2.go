package app

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/atomicphase/atomicphase"
)

// NewWorkflowV2 builds the next release's create_ride, which a rolling
// deploy runs beside NewWorkflow's: it renames create_ride's first phase to
// book_ride (declared, so keys stopped after it resume at the new name),
// adds notify_driver after the charge (an audit record the driver's app
// reads), and removes send_receipt: the payout's record step queues the
// receipt and responds. Adding and removing phases makes it a new version
// (Workflow.Version): a key started under NewWorkflow's definition keeps
// running under it, in a v2 process too, which registers both.
func NewWorkflowV2(stripeBase, bankBase string, receipts *Receipts, transport http.RoundTripper) *atomicphase.Workflow[Ride] {
	client := payoutClient(transport)
	return atomicphase.MustWorkflow("create_ride", startRide, []atomicphase.Phase[Ride]{
		atomicphase.Local("book_ride", createRide).WithFormerNames("create_ride"),
		atomicphase.Foreign("charge", chargeFunc(stripeBase, transport), recordCharge),
		atomicphase.Local("notify_driver", notifyDriver),
		atomicphase.Foreign("payout", payoutFunc(bankBase, client), recordPayoutAndReceipt(receipts)).
			WithReconcile(reconcilePayout(bankBase, client)),
	}, nil)
}

// notifyDriver records, in the ride's transaction, that the driver is to be
// told: one audit record per ride, whichever attempt commits it.
func notifyDriver(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	tx.Queue(`INSERT INTO audit_records (rider, action, data, resource_id, resource_type, user_id)
		VALUES ($1, 'driver_notified', '{}'::jsonb, $2, 'ride', $3)`, r.Email, r.RideID, r.UserID)
	return atomicphase.Continue(), nil
}

// recordPayoutAndReceipt is v2's payout record step: the payout recorded
// (or the refusal answered, as recordPayout does), then the receipt queued
// and the ride answered, in the same commit, as send_receipt did in v1.
func recordPayoutAndReceipt(receipts *Receipts) atomicphase.LocalFunc[Ride] {
	return func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
		out, err := recordPayout(ctx, tx, r)
		if err != nil || r.PayoutRefused != "" {
			return out, err
		}
		if err := receipts.Enqueue(ctx, tx, r); err != nil {
			return atomicphase.Outcome{}, err
		}
		body, err := json.Marshal(map[string]any{"ride_id": r.RideID, "charge_id": r.ChargeID, "payout_id": r.PayoutID, "amount": Amount, "currency": Currency})
		return atomicphase.Respond(http.StatusCreated, body), err
	}
}
