package fakestripe_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// The fake deduplicates by Idempotency-Key and rejects a key reused with
// other parameters, as Stripe does, so a test can count distinct charges.
func ExampleStart() {
	payments, err := fakestripe.Start()
	if err != nil {
		panic(err)
	}
	defer payments.Close()

	post := func(key, form string) {
		req, _ := http.NewRequest("POST", payments.URL+"/v1/charges", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			fmt.Println(resp.StatusCode, "replayed")
			return
		}
		fmt.Println(resp.StatusCode)
	}
	post("order-1", "amount=2000&currency=usd&customer=cus_1")
	post("order-1", "amount=2000&currency=usd&customer=cus_1") // a retry
	post("order-1", "amount=9999&currency=usd&customer=cus_1") // misuse
	fmt.Println(len(payments.Charges()), "charge:", payments.Charges()[0].ID)
	// Output:
	// 200
	// 200 replayed
	// 400
	// 1 charge: ch_fake_000001
}
