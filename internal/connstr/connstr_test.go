package connstr_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/internal/connstr"
)

// Each of these strings is invalid somewhere other than its password, and
// pgx's own error quotes the whole string with the password in it (or half
// of it). None of the password may reach the error.
func TestParseNeverQuotesTheString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ s, secret, reason string }{
		{"host=127.0.0.1 password = S3cretPW port=abc", "S3cretPW", "invalid port"},
		{"password =S3cretPW port=abc", "S3cretPW", "invalid port"},
		{"host=a password='S3cret PW' port=abc", "S3cret", "invalid port"},
		{"postgres://u:p@ss@word@127.0.0.1:abc/db", "ss@word", "invalid port"},
		{"postgres://u:S3cretPW@127.0.0.1:5432/db?pool_max_conns=x", "S3cretPW", "pool_max_conns"},
		{"postgres://u:S3cretPW@127.0.0.1:5432/db?sslmode=bogus", "S3cretPW", "sslmode"},
	} {
		_, err := connstr.Parse(tc.s)
		require.Error(t, err, tc.s)
		require.ErrorIs(t, err, connstr.ErrInvalid)
		msg := err.Error()
		for _, piece := range []string{tc.secret, "ss@word", "word", "S3cret", "127.0.0.1"} {
			if strings.Contains(tc.s, piece) {
				require.NotContains(t, msg, piece, "%q: the error shows no part of the string", tc.s)
			}
		}
		require.Contains(t, msg, tc.reason, "%q: the error still says what is wrong", tc.s)
	}
}

func TestParseValid(t *testing.T) {
	t.Parallel()
	cfg, err := connstr.Parse("postgres://u:pw@127.0.0.1:5433/db")
	require.NoError(t, err)
	require.Equal(t, uint16(5433), cfg.ConnConfig.Port)
	require.Equal(t, "pw", cfg.ConnConfig.Password)
	require.NoError(t, connstr.Redact(nil, "x"))
}

// Display hides every password a connection string can hold, and nothing
// else.
func TestDisplayHidesPasswords(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://ana:s3cret@db.internal:5432/app?sslmode=require":            "postgres://ana:***@db.internal:5432/app?sslmode=require",
		"postgres://ana@db.internal/app?password=s3cret&sslmode=disable":        "postgres://ana@db.internal/app?password=***&sslmode=disable",
		"postgresql://db/app?sslmode=verify-full&sslpassword=k3y&PASSWORD=s3cr": "postgresql://db/app?sslmode=verify-full&sslpassword=***&PASSWORD=***",
		"postgres://ana:p@ss@db/app":                                            "postgres://ana:***@db/app",
		"host=db user=ana password=s3cret dbname=app":                           "host=db user=ana password=*** dbname=app",
		"host=db password = 's3 cr\\'et' dbname=app":                            "host=db password = *** dbname=app",
		"host=db sslpassword=k3y Password=s3cret":                               "host=db sslpassword=*** Password=***",
		"postgres://ana@db/app":                                                 "postgres://ana@db/app",
		"host=db user=ana":                                                      "host=db user=ana",
	} {
		got := connstr.Display(in)
		require.Equal(t, want, got, in)
		for _, secret := range []string{"s3cret", "s3 cr", "k3y", "s3cr", "p@ss"} {
			require.NotContains(t, got, secret, in)
		}
	}
}
