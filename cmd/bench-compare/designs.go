package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/benchkit"
)

// schema is the bench's own tables, beside atomicphase's idempotency_keys:
// Rocket Rides' users and rides, a transactional outbox, and the
// hand-written design's key table, which holds what a careful hand-written
// handler needs (a request hash to refuse a reused key, the response to
// replay) and nothing else.
const schema = `
CREATE TABLE users (
    id                 bigserial PRIMARY KEY,
    email              text      NOT NULL UNIQUE,
    stripe_customer_id text      NOT NULL
);
CREATE TABLE rides (
    id               bigserial        PRIMARY KEY,
    created_at       timestamptz      NOT NULL DEFAULT now(),
    idempotency_key  text             NOT NULL,
    user_id          bigint           NOT NULL REFERENCES users,
    origin_lat       double precision NOT NULL,
    origin_lon       double precision NOT NULL,
    target_lat       double precision NOT NULL,
    target_lon       double precision NOT NULL,
    stripe_charge_id text
);
CREATE INDEX rides_user_key_idx ON rides (user_id, idempotency_key);
CREATE TABLE outbox (
    id         bigserial   PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    ride_id    bigint      NOT NULL REFERENCES rides,
    topic      text        NOT NULL,
    payload    jsonb       NOT NULL
);
CREATE TABLE hw_idempotency_keys (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    bytea       NOT NULL,
    response_status integer,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (scope, idempotency_key)
);`

// The request every fresh design answers: POST /rides with the four
// coordinates, for the authenticated user (the scope); a charge of Amount
// at the payment API.
const (
	method   = "POST"
	path     = "/rides"
	amount   = 2000
	currency = "usd"
)

// rideInput is the request body.
type rideInput struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
}

// rideResponse is the stored and replayed answer, the same in both designs.
type rideResponse struct {
	Key      string `json:"key"`
	ChargeID string `json:"charge_id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

// receipt is the outbox row's payload: what a mailer job would send.
type receipt struct {
	Email    string `json:"email"`
	Key      string `json:"key"`
	ChargeID string `json:"charge_id"`
	Amount   int    `json:"amount"`
}

// user is an authenticated caller: its email is the request's scope.
type user struct {
	id       int64
	email    string
	customer string // its customer id at the payment API
}

// users maps a scope to its user, as an authentication middleware would
// have resolved it before the handler runs.
type users struct {
	mu sync.RWMutex
	m  map[string]*user
}

// get returns the user whose email is scope.
func (u *users) get(scope string) (*user, bool) {
	u.mu.RLock()
	defer u.mu.RUnlock()
	us, ok := u.m[scope]
	return us, ok
}

// create inserts a user per email and registers them.
func (u *users) create(ctx context.Context, pool *pgxpool.Pool, emails []string) ([]*user, error) {
	customers := make([]string, len(emails))
	for i, e := range emails {
		customers[i] = "cus_" + strings.ReplaceAll(e, "-", "_")
	}
	rows, err := pool.Query(ctx, `
		INSERT INTO users (email, stripe_customer_id)
		SELECT * FROM unnest($1::text[], $2::text[])
		RETURNING id, email, stripe_customer_id`, emails, customers)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*user, error) {
		us := &user{}
		return us, r.Scan(&us.id, &us.email, &us.customer)
	})
	if err != nil {
		return nil, fmt.Errorf("create users: %w", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, us := range out {
		u.m[us.email] = us
	}
	return out, nil
}

// rideBody is a request body, distinct per client and request.
func rideBody(buf []byte, client, seq int) []byte {
	f := float64(seq%1000) / 1000
	return fmt.Appendf(buf[:0], `{"origin_lat":%.4f,"origin_lon":%.4f,"target_lat":%.4f,"target_lon":%.4f}`,
		37.7+f/10, -122.4+float64(client)/100, 37.8-f/10, -122.3-float64(client)/100)
}

// ---- (a) hand-written pgx ----

// hwRecordSQL records the key and inserts the ride in one autocommit
// statement: no ride when the key was there already.
const hwRecordSQL = `
WITH k AS (
    INSERT INTO hw_idempotency_keys (scope, idempotency_key, request_hash)
    VALUES ($1, $2, $3)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
INSERT INTO rides (idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
SELECT $2, $4, $5, $6, $7, $8 FROM k
RETURNING id`

const (
	hwChargeSQL   = `UPDATE rides SET stripe_charge_id = $1 WHERE id = $2`
	hwOutboxSQL   = `INSERT INTO outbox (ride_id, topic, payload) VALUES ($1, 'ride.charged', $2)`
	hwResponseSQL = `UPDATE hw_idempotency_keys SET response_status = $3, response_body = $4, finished_at = now()
WHERE scope = $1 AND idempotency_key = $2`
)

// hwReadSQL reads a key's stored response: what hand-written code that
// answers a replay in one round trip reads before it records a key.
const hwReadSQL = `SELECT response_status, response_body FROM hw_idempotency_keys WHERE scope = $1 AND idempotency_key = $2`

// designOpts vary the designs: readFirst has (a) read its key first
// (handWritten); rtt, when positive, puts a delayProxy that adds rtt to
// every round trip between each design's pool and the server.
type designOpts struct {
	readFirst bool
	rtt       time.Duration
}

// handWritten answers a new key the way careful hand-written pgx code
// would: one statement, the call, one pipelined transaction. It returns the
// stored response body. With readFirst it reads the key first, in a round
// trip of its own (hwReadSQL), as code must that answers a finished key's
// retry in one round trip; the bench sends it new keys only, so the read
// finds none.
func handWritten(ctx context.Context, pool *pgxpool.Pool, pay *benchkit.Payments, us *user, key string, body []byte, readFirst bool) ([]byte, error) {
	var in rideInput
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, err
	}
	h := sha256.New()
	_, _ = io.WriteString(h, method+" "+path+"\n")
	_, _ = h.Write(body)
	if readFirst {
		var status pgtype.Int4
		var stored []byte
		err := pool.QueryRow(ctx, hwReadSQL, us.email, key).Scan(&status, &stored)
		if err == nil {
			return nil, fmt.Errorf("key %s/%s was already recorded", us.email, key)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read key: %w", err)
		}
	}
	var rideID int64
	err := pool.QueryRow(ctx, hwRecordSQL, us.email, key, h.Sum(nil), us.id,
		in.OriginLat, in.OriginLon, in.TargetLat, in.TargetLon).Scan(&rideID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("key %s/%s was already recorded", us.email, key)
	}
	if err != nil {
		return nil, fmt.Errorf("record key and ride: %w", err)
	}
	chargeID, err := pay.Charge(ctx, us.customer, "ride-charge/"+us.email+"/"+key, "ride "+key, amount, currency)
	if err != nil {
		return nil, err
	}
	resp, err := json.Marshal(rideResponse{Key: key, ChargeID: chargeID, Amount: amount, Currency: currency})
	if err != nil {
		return nil, err
	}
	payload, err := json.Marshal(receipt{Email: us.email, Key: key, ChargeID: chargeID, Amount: amount})
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(hwChargeSQL, chargeID, rideID)
	b.Queue(hwOutboxSQL, rideID, string(payload))
	b.Queue(hwResponseSQL, us.email, key, http.StatusCreated, resp)
	b.Queue("COMMIT")
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("record charge: %w", err)
	}
	return resp, nil
}

// ---- (b) atomicphase ----

// rideState is the workflow's state, committed with every phase.
type rideState struct {
	Key       string  `json:"key"`
	Email     string  `json:"email"`
	UserID    int64   `json:"user_id"`
	Customer  string  `json:"customer"`
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
	ChargeID  string  `json:"charge_id,omitempty"`
}

const (
	apRideSQL = `INSERT INTO rides (idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
VALUES ($1, $2, $3, $4, $5, $6)`
	apChargeSQL = `UPDATE rides SET stripe_charge_id = $1 WHERE user_id = $2 AND idempotency_key = $3`
	apOutboxSQL = `INSERT INTO outbox (ride_id, topic, payload)
SELECT id, 'ride.charged', $3 FROM rides WHERE user_id = $1 AND idempotency_key = $2`
)

// rideWorkflow is the same request through atomicphase: a local phase
// that inserts the ride (queued, so it travels with the commit that also
// records the key), a foreign phase that charges and whose record step
// queues the charge's update and the outbox row and responds.
func rideWorkflow(us *users, pay *benchkit.Payments) *atomicphase.Workflow[rideState] {
	start := func(in rideInput, req *atomicphase.Request) (rideState, error) {
		u, ok := us.get(req.Scope)
		if !ok {
			return rideState{}, fmt.Errorf("unknown user %q", req.Scope)
		}
		return rideState{Key: req.Key, Email: u.email, UserID: u.id, Customer: u.customer,
			OriginLat: in.OriginLat, OriginLon: in.OriginLon, TargetLat: in.TargetLat, TargetLon: in.TargetLon}, nil
	}
	return atomicphase.MustWorkflow("create_ride", start, []atomicphase.Phase[rideState]{
		atomicphase.Local("create_ride", func(ctx context.Context, tx atomicphase.Tx, r *rideState) (atomicphase.Outcome, error) {
			tx.Queue(apRideSQL, r.Key, r.UserID, r.OriginLat, r.OriginLon, r.TargetLat, r.TargetLon)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, r *rideState) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				id, err := pay.Charge(ctx, r.Customer, key, "ride "+r.Key, amount, currency)
				r.ChargeID = id
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, r *rideState) (atomicphase.Outcome, error) {
			payload, err := json.Marshal(receipt{Email: r.Email, Key: r.Key, ChargeID: r.ChargeID, Amount: amount})
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(apChargeSQL, r.ChargeID, r.UserID, r.Key)
			tx.Queue(apOutboxSQL, r.UserID, r.Key, string(payload))
			body, err := json.Marshal(rideResponse{Key: r.Key, ChargeID: r.ChargeID, Amount: amount, Currency: currency})
			return atomicphase.Respond(http.StatusCreated, body), err
		}),
	}, nil)
}

// runAtomicphase answers a request through runner and returns the
// response body; retry marks the request as a retry (Request.Retry), and
// replay says whether a replay is expected.
func runAtomicphase(ctx context.Context, runner *atomicphase.Runner, wf *atomicphase.Workflow[rideState], scope, key string, body []byte, retry, replay bool) ([]byte, error) {
	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: scope, Key: key, Method: method, Path: path, Params: body, Retry: retry})
	if err != nil {
		return nil, err
	}
	if resp.Status != http.StatusCreated || resp.Replayed != replay {
		return nil, fmt.Errorf("key %s/%s: status %d, replayed %v, want 201, replayed %v", scope, key, resp.Status, resp.Replayed, replay)
	}
	return resp.Body, nil
}

// ---- (d) the floor of a replay, marked or not ----

// pkSelectSQL reads the response columns of a key row by primary key.
const pkSelectSQL = `SELECT response_status, response_header, response_body FROM idempotency_keys
WHERE scope = $1 AND idempotency_key = $2`

// pkSelect reads a key row's response columns by primary key.
func pkSelect(ctx context.Context, pool *pgxpool.Pool, scope, key string, want []byte) error {
	var status *int32
	var header, body []byte
	if err := pool.QueryRow(ctx, pkSelectSQL, scope, key).Scan(&status, &header, &body); err != nil {
		return fmt.Errorf("select %s/%s: %w", scope, key, err)
	}
	if status == nil || *status != http.StatusCreated || !bytes.Equal(body, want) {
		return fmt.Errorf("select %s/%s: not the stored 201", scope, key)
	}
	return nil
}
