package app

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase"
)

// Config is the server's configuration, read from the environment by
// ConfigFromEnv.
type Config struct {
	// DatabaseURL is DATABASE_URL; empty starts a throwaway PostgreSQL
	// from local server binaries.
	DatabaseURL string
	// Addr is ADDR, the listen address. Defaults to 127.0.0.1:8080.
	Addr string
	// StripeAPIBase is STRIPE_API_BASE; empty starts an in-process fake.
	StripeAPIBase string
	// MailerAPIBase is MAILER_API_BASE, where receipts go; empty starts an
	// in-process fake.
	MailerAPIBase string
	// LockTimeout is LOCK_TIMEOUT, the length of a key's lease (renewed
	// while a payout call runs, so it need not exceed the payout timeout).
	// Defaults to 90s.
	LockTimeout time.Duration
	// CallGrace is CALL_GRACE: how long after a payout call's lease ended
	// the bank may still act on it; no retry reconciles before. Defaults to
	// DefaultCallGrace, above the payout timeout.
	CallGrace time.Duration
	// SweepInterval is SWEEP_INTERVAL, the time between two sweeps; 0 runs
	// no sweep. ConfigFromEnv defaults it to 5s.
	SweepInterval time.Duration
	// KeyRetention is KEY_RETENTION, how long the sweep keeps a finished
	// key. Defaults to 24h.
	KeyRetention time.Duration
	// BankAPIBase is BANK_API_BASE, where drivers are paid; empty starts
	// an in-process fake.
	BankAPIBase string
	// ConsoleAddr is CONSOLE_ADDR, where the operator's console (apui) is
	// served, on a port of its own; empty serves none.
	ConsoleAddr string
	// FaultHeader is ATOMICPHASE_FAULT_HEADER=1: honour the
	// Atomicphase-Fault request header (a test hook for the demo).
	FaultHeader bool
	// Release is RIDES_RELEASE, the create_ride definition new requests
	// run: "v1" (the default, NewWorkflow) or "v2" (NewWorkflowV2, the next
	// release's, deployed beside v1's; a v2 server registers both, so it
	// finishes the keys v1 started).
	Release string
	// CitusRoute is CITUS_ROUTE=1: on a Citus coordinator, send each
	// rider's requests to the worker that holds the rider's shard
	// (apcitus.Router), so that the coordinator leaves the requests' path.
	CitusRoute bool
}

// DefaultCallGrace is CALL_GRACE's default: the payout timeout and five
// seconds more. The bank acts on a payout it received, at the latest, by
// the time it would have answered it; a client that gave up at the payout
// timeout leaves it that long, and the margin covers clocks that drift.
const DefaultCallGrace = payoutTimeout + 5*time.Second

// ConfigFromEnv reads Config from the environment. Every malformed
// variable is reported, each with what it wants.
func ConfigFromEnv() (Config, error) {
	cfg := Config{
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		Addr:          os.Getenv("ADDR"),
		StripeAPIBase: strings.TrimRight(os.Getenv("STRIPE_API_BASE"), "/"),
		MailerAPIBase: strings.TrimRight(os.Getenv("MAILER_API_BASE"), "/"),
		BankAPIBase:   strings.TrimRight(os.Getenv("BANK_API_BASE"), "/"),
		LockTimeout:   atomicphase.DefaultLockTimeout,
		CallGrace:     DefaultCallGrace,
		SweepInterval: atomicphase.DefaultSweepInterval,
		KeyRetention:  atomicphase.DefaultKeyRetention,
		FaultHeader:   os.Getenv("ATOMICPHASE_FAULT_HEADER") == "1",
		ConsoleAddr:   os.Getenv("CONSOLE_ADDR"),
		Release:       os.Getenv("RIDES_RELEASE"),
		CitusRoute:    os.Getenv("CITUS_ROUTE") == "1",
	}
	var errs []error
	switch cfg.Release {
	case "":
		cfg.Release = "v1"
	case "v1", "v2":
	default:
		errs = append(errs, fmt.Errorf("RIDES_RELEASE=%q: want v1 or v2", cfg.Release))
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8080"
	}
	for _, v := range []struct {
		name   string
		dst    *time.Duration
		zeroOK bool
		want   string
	}{
		{"LOCK_TIMEOUT", &cfg.LockTimeout, false, "a positive Go duration such as 90s"},
		{"CALL_GRACE", &cfg.CallGrace, false, "a positive Go duration such as 15s"},
		{"SWEEP_INTERVAL", &cfg.SweepInterval, true, "a Go duration of at least 1ms such as 5s, or 0 to turn the sweep off"},
		{"KEY_RETENTION", &cfg.KeyRetention, false, "a positive Go duration such as 24h"},
	} {
		s := os.Getenv(v.name)
		if s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || (d == 0 && !v.zeroOK) || (d > 0 && d < time.Millisecond) {
			errs = append(errs, fmt.Errorf("%s=%q: want %s", v.name, s, v.want))
			continue
		}
		*v.dst = d
	}
	return cfg, errors.Join(errs...)
}
