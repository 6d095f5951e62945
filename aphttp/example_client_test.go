package aphttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atomicphase/atomicphase/aphttp"
)

// ExampleClient books through a service whose first answer is a 503 and
// whose second is a 409 while the first attempt is still in progress: the
// client retries both with the same Idempotency-Key, as the server's
// contract asks, and returns the 201.
func ExampleClient() {
	var attempts atomic.Int32
	keys := make(chan string, 3)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get(aphttp.HeaderName)
		switch attempts.Add(1) {
		case 1:
			aphttp.WriteProblem(w, aphttp.Problem{Type: aphttp.ProblemTransientFailure, Title: "Temporary failure", Status: 503}, 1)
		case 2:
			aphttp.WriteProblem(w, aphttp.Problem{Type: aphttp.ProblemInProgress, Title: "In progress", Status: 409}, 1)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"ride_id": 7}`)
		}
	}))
	defer svc.Close()

	client := aphttp.NewClient(&aphttp.ClientOptions{Timeout: time.Minute})
	req, err := http.NewRequest(http.MethodPost, svc.URL+"/rides", strings.NewReader(`{"origin": "SFO"}`))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := client.Do(req) // no key given: the client draws one
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	first, second, third := <-keys, <-keys, <-keys
	fmt.Println(resp.StatusCode, "after", resp.Attempts, "attempts; replayed:", resp.Replayed)
	fmt.Println("one key on every attempt:", first == second && second == third && first == resp.Key)
	// Output:
	// 201 after 3 attempts; replayed: true
	// one key on every attempt: true
}
