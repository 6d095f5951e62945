package apcitus

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A worker's pool tries the TLS modes the entry's tries, in the same
// order, against the worker, whose name the TLS check expects.
func TestWorkerConfigKeepsTheEntrysTLSModes(t *testing.T) {
	t.Parallel()
	type attempt struct {
		host       string
		port       uint16
		tls        bool
		serverName string
	}
	attempts := func(cfg *pgxpool.Config) []attempt {
		cc := cfg.ConnConfig
		out := []attempt{{cc.Host, cc.Port, cc.TLSConfig != nil, ""}}
		if cc.TLSConfig != nil {
			out[0].serverName = cc.TLSConfig.ServerName
		}
		for _, fb := range cc.Fallbacks {
			a := attempt{fb.Host, fb.Port, fb.TLSConfig != nil, ""}
			if fb.TLSConfig != nil {
				a.serverName = fb.TLSConfig.ServerName
			}
			out = append(out, a)
		}
		return out
	}
	for _, tc := range []struct {
		url  string
		want []attempt
	}{
		{"postgres://u@coord:5432/db", []attempt{{"worker", 6000, true, "worker"}, {"worker", 6000, false, ""}}}, // prefer
		{"postgres://u@coord:5432/db?sslmode=allow", []attempt{{"worker", 6000, false, ""}, {"worker", 6000, true, "worker"}}},
		{"postgres://u@coord:5432/db?sslmode=disable", []attempt{{"worker", 6000, false, ""}}},
		{"postgres://u@coord:5432/db?sslmode=require", []attempt{{"worker", 6000, true, "worker"}}},
		{"postgres://u@coord:5432,standby:5433/db?sslmode=verify-full", []attempt{{"worker", 6000, true, "worker"}}},
	} {
		entry, err := pgxpool.ParseConfig(tc.url)
		require.NoError(t, err)
		before := attempts(entry)
		require.Equal(t, tc.want, attempts(workerConfig(entry, "worker", 6000)), tc.url)
		require.Equal(t, before, attempts(entry), "the entry's configuration is left as it was: %s", tc.url)
	}
}
