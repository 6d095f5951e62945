// Command rocketrides is the Rocket Rides example server: a ride-booking API
// whose POST /rides records a ride, charges the rider's card at a
// Stripe-compatible payment API, pays the driver through a bank API without
// idempotency keys and queues a receipt in the same transaction as its
// answer, safely retryable with an Idempotency-Key; River
// delivers the receipts to a mailer API, and a background sweep finishes
// requests whose clients gave up and deletes old keys. README.md beside
// this file describes how to start it, what it answers, what it sends to
// the payment API and the mailer, and the invariants it keeps.
//
//	go run ./examples/rocketrides
//
// Environment: DATABASE_URL (empty: a throwaway PostgreSQL from local
// server binaries), ADDR (127.0.0.1:8080), STRIPE_API_BASE, BANK_API_BASE
// and MAILER_API_BASE (empty: in-process fakes), LOCK_TIMEOUT (90s), CALL_GRACE (15s),
// SWEEP_INTERVAL (5s; 0 turns the sweep off), KEY_RETENTION (24h),
// ATOMICPHASE_FAULTS and ATOMICPHASE_FAULT_HEADER (fault injection, for
// tests).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/atomicphase/atomicphase/examples/rocketrides/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := app.ConfigFromEnv()
	if err == nil {
		err = app.Run(ctx, cfg, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rocketrides:", err)
		os.Exit(1)
	}
}
