// Package benchkit holds what the benchmark commands (cmd/bench-compare,
// cmd/bench-scale) share: the payment API client every design calls, and
// the percentile of a latency sample.
package benchkit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Payments calls a Stripe-shaped payment API (atomicphasetest/fakestripe,
// over loopback HTTP), for every design alike.
type Payments struct {
	base   string
	client *http.Client
}

// NewPayments returns a client of the API at base (without /v1), with a
// connection pool for conns concurrent calls.
func NewPayments(base string, conns int) *Payments {
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Payments{base: base + "/v1/charges", client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Charge creates a charge of amount in currency for customer under the
// idempotency key, and returns its id.
func (p *Payments) Charge(ctx context.Context, customer, key, description string, amount int, currency string) (string, error) {
	form := url.Values{
		"amount":   {strconv.Itoa(amount)},
		"currency": {currency},
		"customer": {customer},
	}
	if description != "" {
		form.Set("description", description)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("charge: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("charge: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("charge: %s: %s", resp.Status, body)
	}
	var ch struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &ch); err != nil || ch.ID == "" {
		return "", fmt.Errorf("charge: unreadable answer %q", body)
	}
	return ch.ID, nil
}

// Percentile returns the q-quantile of sorted (nearest rank); sorted must
// not be empty.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
