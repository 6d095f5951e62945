// Package fakestripe is a small Stripe-compatible payment API for tests and
// examples: a real HTTP server on a loopback port, so a workflow's foreign
// phase can call it through any HTTP client, the Stripe Go client included,
// and a test can then assert "charged exactly once".
//
// It serves one endpoint, POST /v1/charges, with a form body (amount,
// currency, customer, description), and answers as Stripe does:
//
//   - 200 and a charge object whose id starts with ch_ for a new charge;
//   - the stored first answer again, byte for byte, with the header
//     Idempotent-Replayed: true, for a repeated Idempotency-Key with the same
//     parameters (a request without a key is a new charge every time);
//   - 400 with error type idempotency_error for a key reused with other
//     parameters, and nothing charged;
//   - 402 with error type card_error (code card_declined) for every customer
//     id that contains "declined";
//   - 400 with error type invalid_request_error for a missing customer or an
//     amount that is not a positive integer, stored under no key (Stripe
//     keeps only answers its endpoint got to decide);
//   - 500 with error type api_error, nothing charged and nothing stored, for
//     the requests FailNext asked to fail.
//
// Charges lists the distinct charges made and Requests counts the requests
// received, repeats included. The package imports no test machinery, so a
// development server may start it in process too.
package fakestripe

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Server is a running fake payment API. Its methods are safe for concurrent
// use.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT, to give a Stripe
	// client as its API base (without /v1; the endpoint is
	// URL+"/v1/charges").
	URL string

	srv *http.Server
	ln  net.Listener

	mu       sync.Mutex
	byKey    map[string]stored // idempotency key → first answer
	charges  []Charge          // successful charges, in order
	requests int
	failNext int
}

// Charge is a successful charge the fake made.
type Charge struct {
	// ID is the charge's id: ch_fake_ and a six-digit sequence number,
	// starting at ch_fake_000001 on each Server.
	ID string
	// Customer is the customer parameter the charge was made for.
	Customer string
	// Amount is the amount parameter, in the currency's smallest unit.
	Amount int64
	// IdempotencyKey is the Idempotency-Key header of the request that
	// made the charge, or "" for a request without one.
	IdempotencyKey string
}

type stored struct {
	params string
	status int
	body   []byte
}

// Start listens on a free loopback port and serves the fake API until
// Close.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), ln: ln, byKey: map[string]stored{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.createCharge)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server, waiting up to five seconds for requests in
// flight.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// Charges returns the distinct successful charges made so far, in order. A
// replayed request adds none.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Charge(nil), s.charges...)
}

// Requests counts the charge requests received so far, replays, failures
// and rejections included.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// FailNext makes the next n charge requests fail with a 500, charging
// nothing and storing nothing under their keys, as a payment API having a
// bad moment would: a retry with the same key then charges.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = n
}

func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeJSON(w, 400, errorBody("invalid_request_error", "", "cannot parse the form body"))
		return
	}
	params := r.PostForm.Encode()
	key := r.Header.Get("Idempotency-Key")

	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if s.failNext > 0 {
		s.failNext--
		writeJSON(w, 500, errorBody("api_error", "", "an error occurred on our side"))
		return
	}
	if key != "" {
		if prev, ok := s.byKey[key]; ok {
			if prev.params != params {
				writeJSON(w, 400, errorBody("idempotency_error", "",
					"Keys for idempotent requests can only be used with the same parameters they were first used with. "+
						"Try using a key other than '"+key+"' if you meant to execute a different request."))
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			writeRaw(w, prev.status, prev.body)
			return
		}
	}
	status, body := s.charge(r.PostForm, key)
	// Like Stripe, keep only answers the endpoint got to decide: a request
	// that failed validation stores nothing, so a corrected one may reuse
	// the key.
	if key != "" && status != http.StatusBadRequest {
		s.byKey[key] = stored{params: params, status: status, body: body}
	}
	writeRaw(w, status, body)
}

// charge decides a new charge; s.mu is held.
func (s *Server) charge(form url.Values, key string) (int, []byte) {
	customer := form.Get("customer")
	var amount int64
	if _, err := fmt.Sscan(form.Get("amount"), &amount); err != nil || amount <= 0 {
		b, _ := json.Marshal(errorBody("invalid_request_error", "parameter_missing", "amount must be a positive integer"))
		return 400, b
	}
	if customer == "" {
		b, _ := json.Marshal(errorBody("invalid_request_error", "parameter_missing", "customer is required"))
		return 400, b
	}
	if strings.Contains(customer, "declined") {
		b, _ := json.Marshal(errorBody("card_error", "card_declined", "Your card was declined."))
		return 402, b
	}
	ch := Charge{ID: fmt.Sprintf("ch_fake_%06d", len(s.charges)+1), Customer: customer, Amount: amount, IdempotencyKey: key}
	s.charges = append(s.charges, ch)
	b, _ := json.Marshal(map[string]any{
		"id": ch.ID, "object": "charge", "amount": amount, "currency": form.Get("currency"),
		"customer": customer, "description": form.Get("description"), "paid": true, "captured": true,
		"status": "succeeded", "livemode": false, "created": time.Now().Unix(),
	})
	return 200, b
}

func errorBody(typ, code, msg string) map[string]any {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	return map[string]any{"error": e}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
