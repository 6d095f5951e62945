package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigFromEnvDefaults(t *testing.T) {
	for _, v := range []string{"DATABASE_URL", "ADDR", "STRIPE_API_BASE", "MAILER_API_BASE", "BANK_API_BASE",
		"LOCK_TIMEOUT", "CALL_GRACE", "SWEEP_INTERVAL", "KEY_RETENTION", "ATOMICPHASE_FAULT_HEADER", "RIDES_RELEASE", "CITUS_ROUTE"} {
		t.Setenv(v, "")
	}
	cfg, err := ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, Config{
		Addr: "127.0.0.1:8080", LockTimeout: 90 * time.Second, CallGrace: 15 * time.Second, SweepInterval: 5 * time.Second, KeyRetention: 24 * time.Hour,
		Release: "v1",
	}, cfg)
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("MAILER_API_BASE", "http://127.0.0.1:9/")
	t.Setenv("SWEEP_INTERVAL", "0")
	t.Setenv("KEY_RETENTION", "1ms")
	t.Setenv("LOCK_TIMEOUT", "2s")
	cfg, err := ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:9", cfg.MailerAPIBase)
	require.Zero(t, cfg.SweepInterval, "0 turns the sweep off")
	require.Equal(t, time.Millisecond, cfg.KeyRetention)
	require.Equal(t, 2*time.Second, cfg.LockTimeout)
}

// TestConfigFromEnvNamesEveryBadDuration: each malformed duration is
// reported, with what it wants.
func TestConfigFromEnvNamesEveryBadDuration(t *testing.T) {
	t.Setenv("LOCK_TIMEOUT", "0")
	t.Setenv("SWEEP_INTERVAL", "-5s")
	t.Setenv("KEY_RETENTION", "a day")
	t.Setenv("RIDES_RELEASE", "v3")
	_, err := ConfigFromEnv()
	for _, want := range []string{`LOCK_TIMEOUT="0"`, `SWEEP_INTERVAL="-5s"`, "or 0 to turn the sweep off", `KEY_RETENTION="a day"`, `RIDES_RELEASE="v3": want v1 or v2`} {
		require.ErrorContains(t, err, want)
	}
}

// A DATABASE_URL invalid elsewhere than its password stops the server with
// an error that says what is wrong and shows no part of the password.
func TestRunKeepsTheDatabasePasswordSecret(t *testing.T) {
	for _, url := range []string{
		"host=127.0.0.1 password = S3cretPW port=abc",
		"password =S3cretPW port=abc",
		"postgres://u:S3c@retPW@127.0.0.1:abc/db",
	} {
		var log strings.Builder
		err := Run(context.Background(), Config{DatabaseURL: url, Addr: "127.0.0.1:0"}, &log)
		require.Error(t, err, url)
		require.Contains(t, err.Error(), "invalid port")
		for _, out := range []string{err.Error(), log.String()} {
			require.NotContains(t, out, "S3c", url)
			require.NotContains(t, out, "retPW", url)
		}
	}
}
