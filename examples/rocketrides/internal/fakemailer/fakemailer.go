// Package fakemailer is the mailer API Rocket Rides sends ride receipts to,
// faked for the example, its tests and its demo: a real HTTP server on a
// loopback port, so the receipt worker talks to it as it would to a real
// mailer, and a test can then assert "one receipt per ride".
//
// It serves one endpoint, POST /v1/messages, with a JSON body
// {"to": ..., "ride_id": ..., "charge_id": ...} and an Idempotency-Key
// header, and answers:
//
//   - 200 and {"id": "msg_…", …} for a new message, which it keeps;
//   - the stored first answer again, with Idempotent-Replayed: true, for a
//     repeated Idempotency-Key with the same message (a delivery attempt
//     whose answer was lost, say);
//   - 422 for a key reused with another message, and 400, 415 or 422 for a
//     request without a key, not JSON, or missing a member;
//   - 503, keeping nothing, for the requests FailNext asked to fail;
//   - nothing at all for the requests HangNext asked to hang: they wait
//     until the client gives up or the server closes, keeping nothing.
//
// Receipts lists the distinct messages kept; Attempts lists every request
// with the key it carried and the status it got. The package imports no
// test machinery, so the example server starts it in process when
// MAILER_API_BASE is empty.
package fakemailer

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

// Server is a running fake mailer. Its methods are safe for concurrent use.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT; the endpoint is
	// URL+"/v1/messages".
	URL string

	srv     *http.Server
	closing chan struct{}

	mu       sync.Mutex
	byKey    map[string]int // idempotency key → index in receipts
	receipts []Receipt
	attempts []Attempt
	failNext int
	hangNext int
	onNew    func(Receipt)
}

// Receipt is a message the fake kept: one per distinct Idempotency-Key.
type Receipt struct {
	// ID is the message's id: msg_ and a six-digit sequence number.
	ID string
	// Key is the Idempotency-Key the message was first sent with.
	Key      string
	To       string
	RideID   int64
	ChargeID string
	// At is when the message was kept.
	At time.Time
}

// Attempt is one request the fake received.
type Attempt struct {
	// Key is the request's Idempotency-Key header.
	Key string
	// Status is the status it was answered with; 0 for a request that hung
	// until the client gave up.
	Status int
}

// Start listens on a free loopback port and serves the fake mailer until
// Close. onNew, if not nil, is called with every new receipt it keeps (the
// example server logs them).
func Start(onNew func(Receipt)) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), closing: make(chan struct{}), byKey: map[string]int{}, onNew: onNew}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.send)
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

// Receipts returns the distinct messages kept so far, in order.
func (s *Server) Receipts() []Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Receipt(nil), s.receipts...)
}

// Attempts returns every request received so far, in order: repeats,
// failures and hung requests included.
func (s *Server) Attempts() []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Attempt(nil), s.attempts...)
}

// FailNext makes the next n requests fail with a 503, keeping nothing, as
// a mailer having a bad moment would: a retry with the same key is then
// kept.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = n
}

// HangNext makes the next n requests hang, keeping nothing, until their
// client gives up or the server closes: a delivery in flight for as long
// as a test needs, to kill the process that sent it.
func (s *Server) HangNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangNext = n
}

type message struct {
	To       *string `json:"to"`
	RideID   *int64  `json:"ride_id"`
	ChargeID *string `json:"charge_id"`
}

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var msg message
	status, answer := 0, map[string]any(nil)
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		status, answer = http.StatusUnsupportedMediaType, problem("send Content-Type: application/json")
	} else if key == "" {
		status, answer = http.StatusBadRequest, problem("the Idempotency-Key header is required")
	} else if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&msg); err != nil ||
		msg.To == nil || *msg.To == "" || msg.RideID == nil || msg.ChargeID == nil || *msg.ChargeID == "" {
		status, answer = http.StatusUnprocessableEntity, problem("want {\"to\": string, \"ride_id\": number, \"charge_id\": string}")
	}

	s.mu.Lock()
	switch {
	case status != 0:
	case s.hangNext > 0:
		s.hangNext--
		s.attempts = append(s.attempts, Attempt{Key: key})
		s.mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return
	case s.failNext > 0:
		s.failNext--
		status, answer = http.StatusServiceUnavailable, problem("the mailer is having a bad moment")
	default:
		got := Receipt{Key: key, To: *msg.To, RideID: *msg.RideID, ChargeID: *msg.ChargeID}
		if i, ok := s.byKey[key]; ok {
			if prev := s.receipts[i]; prev.To != got.To || prev.RideID != got.RideID || prev.ChargeID != got.ChargeID {
				status, answer = http.StatusUnprocessableEntity, problem("Idempotency-Key "+key+" was first used with another message")
				break
			}
			w.Header().Set("Idempotent-Replayed", "true")
			got = s.receipts[i]
		} else {
			got.ID, got.At = fmt.Sprintf("msg_%06d", len(s.receipts)+1), time.Now()
			s.byKey[key] = len(s.receipts)
			s.receipts = append(s.receipts, got)
			if s.onNew != nil {
				defer s.onNew(got)
			}
		}
		status, answer = http.StatusOK, map[string]any{"id": got.ID, "to": got.To, "ride_id": got.RideID, "charge_id": got.ChargeID}
	}
	s.attempts = append(s.attempts, Attempt{Key: key, Status: status})
	s.mu.Unlock()

	b, _ := json.Marshal(answer)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func problem(msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg}}
}
