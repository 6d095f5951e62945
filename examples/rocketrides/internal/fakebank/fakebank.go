// Package fakebank is the legacy bank API Rocket Rides pays its drivers
// through, faked for the example, its tests and its demo: a real HTTP
// server on a loopback port, so the payout phase talks to it as it would to
// a real bank, and a test can then assert "one payout per ride".
//
// Like the bank it stands for, it has no idempotency keys: every accepted
// POST /payouts creates a payout, however many carry the same reference.
// It serves:
//
//   - POST /payouts with a JSON body {"reference", "account", "amount",
//     "currency"}: 201 and {"id": "po_…", "reference": …, …} for a payout
//     made; 400 or 422 for a body it cannot take (nothing paid);
//   - GET /payouts?reference=R: 200 and {"data": [...]}, every payout made
//     with reference R, oldest first (an empty list when none). A payout
//     made is listed by the time any later lookup is answered.
//
// Failure injection, for tests: FailNext makes the next payout calls go
// wrong in one of the ways a real bank does (acting and then answering
// 5xx or dropping the connection, refusing with 5xx or 4xx, hanging), and
// LookupDownFor makes the next lookups answer 503. Payouts lists what was
// paid; Calls and Lookups count the requests.
//
// The package imports no test machinery, so the example server starts it in
// process when BANK_API_BASE is empty.
package fakebank

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"sync"
	"time"
)

// Failure is a way a payout call goes wrong, for FailNext.
type Failure string

// The failures FailNext takes.
const (
	// ActThen5xx makes the payout, then answers 503: the outcome is unknown
	// to the caller, and the payout exists.
	ActThen5xx Failure = "act-then-5xx"
	// ActThenDrop makes the payout, then closes the connection without an
	// answer.
	ActThenDrop Failure = "act-then-drop"
	// Refuse5xx answers 503 without making the payout: the outcome is
	// unknown to the caller, and no payout exists.
	Refuse5xx Failure = "refuse-5xx"
	// Refuse4xx answers 403 without making the payout: a refusal.
	Refuse4xx Failure = "refuse-4xx"
	// Hang answers nothing and makes no payout until the client gives up or
	// the server closes.
	Hang Failure = "hang"
)

// Server is a running fake bank. Its methods are safe for concurrent use.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT; the endpoints
	// are URL+"/payouts".
	URL string

	srv     *http.Server
	closing chan struct{}

	mu         sync.Mutex
	payouts    []Payout
	fail       []Failure
	lookupDown int
	slow       time.Duration
	calls      int
	lookups    int
	onNew      func(Payout)
}

// Payout is a payout the bank made: one per accepted call.
type Payout struct {
	// ID is po_ and a six-digit sequence number.
	ID        string    `json:"id"`
	Reference string    `json:"reference"`
	Account   string    `json:"account"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Created   time.Time `json:"created"`
}

// Start listens on a free loopback port and serves the fake bank until
// Close. onNew, if not nil, is called with every payout it makes (the
// example server logs them).
func Start(onNew func(Payout)) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), closing: make(chan struct{}), onNew: onNew}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payouts", s.pay)
	mux.HandleFunc("GET /payouts", s.lookup)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server: hanging requests end at once, others get up to
// five seconds.
func (s *Server) Close() error {
	close(s.closing)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// FailNext makes the next payout calls fail, one failure per call, in order.
func (s *Server) FailNext(failures ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, failures...)
}

// SlowDown makes every later payout call take d: the payout is made, and
// answered, d after the call arrived, whether or not the caller still
// waits (a caller giving up does not stop it). Until then a lookup does not
// see it.
func (s *Server) SlowDown(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow = d
}

// LookupDownFor makes the next n lookups answer 503.
func (s *Server) LookupDownFor(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookupDown = n
}

// Payouts returns every payout made so far, in order.
func (s *Server) Payouts() []Payout {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Payout(nil), s.payouts...)
}

// PerReference counts the payouts made per reference.
func (s *Server) PerReference() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	for _, p := range s.payouts {
		n[p.Reference]++
	}
	return n
}

// Calls counts the POST /payouts requests received, failed ones included.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Lookups counts the GET /payouts requests received, failed ones included.
func (s *Server) Lookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

type payoutRequest struct {
	Reference *string `json:"reference"`
	Account   *string `json:"account"`
	Amount    *int64  `json:"amount"`
	Currency  *string `json:"currency"`
}

func (s *Server) pay(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls++
	slow := s.slow
	var mode Failure
	if len(s.fail) > 0 {
		mode, s.fail = s.fail[0], s.fail[1:]
	}
	s.mu.Unlock()

	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send application/json")
		return
	}
	var in payoutRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "not JSON: "+err.Error())
		return
	}
	if in.Reference == nil || *in.Reference == "" || in.Account == nil || in.Amount == nil || *in.Amount <= 0 || in.Currency == nil {
		writeError(w, http.StatusUnprocessableEntity, "reference, account, amount (positive) and currency are required")
		return
	}
	switch mode {
	case Refuse5xx:
		writeError(w, http.StatusServiceUnavailable, "try again later")
		return
	case Refuse4xx:
		writeError(w, http.StatusForbidden, "payouts to this account are refused")
		return
	case Hang:
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return
	}
	if slow > 0 {
		select {
		case <-time.After(slow):
		case <-s.closing:
			return
		}
	}
	p := s.makePayout(in)
	switch mode {
	case ActThen5xx:
		writeError(w, http.StatusBadGateway, "upstream error")
		return
	case ActThenDrop:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection all the same
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(p)
}

func (s *Server) makePayout(in payoutRequest) Payout {
	s.mu.Lock()
	p := Payout{
		ID: fmt.Sprintf("po_%06d", len(s.payouts)+1), Reference: *in.Reference, Account: *in.Account,
		Amount: *in.Amount, Currency: *in.Currency, Created: time.Now().UTC(),
	}
	s.payouts = append(s.payouts, p)
	onNew := s.onNew
	s.mu.Unlock()
	if onNew != nil {
		onNew(p)
	}
	return p
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	s.mu.Lock()
	s.lookups++
	down := s.lookupDown > 0
	if down {
		s.lookupDown--
	}
	data := []Payout{}
	for _, p := range s.payouts {
		if p.Reference == ref {
			data = append(data, p)
		}
	}
	s.mu.Unlock()
	switch {
	case down:
		writeError(w, http.StatusServiceUnavailable, "lookups are down")
	case ref == "":
		writeError(w, http.StatusBadRequest, "reference is required")
	default:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg}})
}
