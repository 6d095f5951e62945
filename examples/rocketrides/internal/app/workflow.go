package app

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase"
)

// Ride is the workflow's state, committed with every phase.
type Ride struct {
	Email     string  `json:"email"`
	Key       string  `json:"key"`
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`

	UserID     int64  `json:"user_id,omitempty"`
	CustomerID string `json:"customer_id,omitempty"`
	RideID     int64  `json:"ride_id,omitempty"`
	ChargeID   string `json:"charge_id,omitempty"`
	Declined   string `json:"declined,omitempty"` // the payment API's decline message
	PayoutID   string `json:"payout_id,omitempty"`
	// PayoutRefused is the bank's refusal of the payout (a 4xx: nothing
	// paid), which ends the request with a stored 424.
	PayoutRefused string `json:"payout_refused,omitempty"`
}

// Amount and Currency of every ride.
const (
	Amount   = 2000
	Currency = "usd"
)

// RideInput is what a client sends to book a ride: the four coordinates,
// each required. What the phases compute (the ride, the charge, a decline)
// lives in Ride, which no request body can reach.
type RideInput struct {
	OriginLat *float64 `json:"origin_lat"`
	OriginLon *float64 `json:"origin_lon"`
	TargetLat *float64 `json:"target_lat"`
	TargetLon *float64 `json:"target_lon"`
}

// NewWorkflow builds create_ride: record the ride (and an audit record),
// charge the card at the payment API at stripeBase, pay the driver at the
// bank API at bankBase, queue the receipt with receipts and respond 201. A
// declined card is a stored 402: no payout, no receipt.
func NewWorkflow(stripeBase, bankBase string, receipts *Receipts) *atomicphase.Workflow[Ride] {
	return NewWorkflowOver(stripeBase, bankBase, receipts, nil)
}

// NewWorkflowOver is NewWorkflow with the HTTP transport its calls to the
// payment API and the bank go through (http.DefaultTransport when nil): a
// test's, which can break connections.
func NewWorkflowOver(stripeBase, bankBase string, receipts *Receipts, transport http.RoundTripper) *atomicphase.Workflow[Ride] {
	return atomicphase.MustWorkflow("create_ride", startRide, []atomicphase.Phase[Ride]{
		atomicphase.Local("create_ride", createRide),
		atomicphase.Foreign("charge", chargeFunc(stripeBase, transport), recordCharge),
		payoutPhase(bankBase, transport),
		atomicphase.Local("send_receipt", sendReceiptFunc(receipts)),
	}, nil)
}

// startRide validates the input before anything is stored: a 422 for a bad
// body leaves the key free for a corrected retry.
func startRide(in RideInput, req *atomicphase.Request) (Ride, error) {
	r := Ride{Email: req.Scope, Key: req.Key}
	for _, f := range []struct {
		name  string
		limit float64
		src   *float64
		dst   *float64
	}{
		{"origin_lat", 90, in.OriginLat, &r.OriginLat}, {"origin_lon", 180, in.OriginLon, &r.OriginLon},
		{"target_lat", 90, in.TargetLat, &r.TargetLat}, {"target_lon", 180, in.TargetLon, &r.TargetLon},
	} {
		if f.src == nil {
			return Ride{}, atomicphase.Invalid("%s is required, as a number", f.name)
		}
		if *f.src < -f.limit || *f.src > f.limit {
			return Ride{}, atomicphase.Invalid("%s must be within [-%g, %g]", f.name, f.limit, f.limit)
		}
		*f.dst = *f.src
	}
	return r, nil
}

func createRide(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	if err := tx.QueryRow(ctx, `SELECT id, stripe_customer_id FROM users WHERE email = $1`, r.Email).
		Scan(&r.UserID, &r.CustomerID); err != nil {
		return atomicphase.Outcome{}, fmt.Errorf("look up user: %w", err)
	}
	// A ride's id is drawn at random, not from a sequence shared by all
	// riders: a rider could count the platform's rides from the ids of
	// their own. It fits a JSON number exactly (below 2^53).
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return atomicphase.Outcome{}, err
	}
	r.RideID = int64(binary.BigEndian.Uint64(rnd[:])>>11) + 1
	if _, err := tx.Exec(ctx, `
		INSERT INTO rides (id, rider, idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		r.RideID, r.Email, r.Key, r.UserID, r.OriginLat, r.OriginLon, r.TargetLat, r.TargetLon); err != nil {
		return atomicphase.Outcome{}, err
	}
	// The audit record's jsonb travels as JSON text, which a jsonb
	// parameter takes in every pgx exec mode: a Go map cannot be encoded
	// under the exec and simple_protocol modes (the ones that work through
	// a transaction-pooling PgBouncer), where pgx does not know the
	// parameter is jsonb.
	data, err := json.Marshal(map[string]any{"origin_lat": r.OriginLat, "origin_lon": r.OriginLon, "target_lat": r.TargetLat, "target_lon": r.TargetLon})
	if err != nil {
		return atomicphase.Outcome{}, atomicphase.Permanent(fmt.Errorf("encode the audit record: %w", err))
	}
	tx.Queue(`
		INSERT INTO audit_records (rider, action, data, resource_id, resource_type, user_id)
		VALUES ($1, 'create_ride', $2::jsonb, $3, 'ride', $4)`,
		r.Email, string(data), r.RideID, r.UserID)
	return atomicphase.Continue(), nil
}

// chargeFunc charges through the real Stripe Go client, pointed at base
// over transport (http.DefaultTransport when nil),
// with the derived downstream key and client-side retries off (the client
// retries the whole request with its own key; each SDK retry would count as
// another foreign call).
func chargeFunc(base string, transport http.RoundTripper) atomicphase.CallFunc[Ride] {
	return func(ctx context.Context, call *atomicphase.ForeignCall, r *Ride) error {
		backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
			URL:               stripe.String(base),
			HTTPClient:        &http.Client{Transport: call.Transport(transport), Timeout: 15 * time.Second},
			MaxNetworkRetries: stripe.Int64(0),
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
			EnableTelemetry:   stripe.Bool(false),
		})
		sc := stripe.NewClient("sk_test_rocketrides", stripe.WithBackends(&stripe.Backends{API: backend}))
		params := &stripe.ChargeCreateParams{
			Amount:      stripe.Int64(Amount),
			Currency:    stripe.String(Currency),
			Customer:    stripe.String(r.CustomerID),
			Description: stripe.String(fmt.Sprintf("Charge for ride %d", r.RideID)),
		}
		params.SetIdempotencyKey(call.Key())
		ch, err := sc.V1Charges.Create(ctx, params)
		var serr *stripe.Error
		switch {
		case errors.As(err, &serr) && serr.HTTPStatusCode == http.StatusPaymentRequired:
			r.Declined = serr.Msg // a final answer, stored like a success
			return nil
		case err != nil:
			return fmt.Errorf("charge: %w", err) // transient: the retry repeats the call, same key
		}
		r.ChargeID = ch.ID
		return nil
	}
}

func recordCharge(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
	if r.Declined != "" {
		body, err := json.Marshal(map[string]any{"error": map[string]any{
			"type": "card_declined", "message": r.Declined, "ride_id": r.RideID}})
		return atomicphase.Respond(http.StatusPaymentRequired, body), err
	}
	// Queued: the update travels with the phase's commit, no round trip of
	// its own.
	tx.Queue(`UPDATE rides SET stripe_charge_id = $1 WHERE rider = $2 AND id = $3`, r.ChargeID, r.Email, r.RideID)
	return atomicphase.Continue(), nil
}

// sendReceiptFunc is the last phase: the receipt job is inserted through
// the phase's transaction, so it commits with the stored 201 (and is
// delivered) or rolls back with it (and a retry inserts it again); never
// one without the other.
func sendReceiptFunc(receipts *Receipts) atomicphase.LocalFunc[Ride] {
	return func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
		if err := receipts.Enqueue(ctx, tx, r); err != nil {
			return atomicphase.Outcome{}, err
		}
		body, err := json.Marshal(map[string]any{"ride_id": r.RideID, "charge_id": r.ChargeID, "payout_id": r.PayoutID, "amount": Amount, "currency": Currency})
		return atomicphase.Respond(http.StatusCreated, body), err
	}
}

// FaultPoints are the places the create_ride workflow passes, in the
// PHASE:PLACE form of ATOMICPHASE_FAULTS (* for the acquisition places).
// Three commits: create_ride's, which also records the key; charge's
// record step; and payout's record step, fused with send_receipt, which
// stores the response.
var FaultPoints = []string{
	"*:before-acquire",
	"create_ride:before-phase", "create_ride:before-commit", "create_ride:after-commit",
	"charge:before-phase", "charge:after-foreign", "charge:before-commit", "charge:after-commit",
	"payout:before-phase", "payout:after-foreign",
	"send_receipt:before-phase", "send_receipt:before-response", "send_receipt:before-commit", "send_receipt:after-commit",
}
