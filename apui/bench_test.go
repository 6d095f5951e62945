package apui

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// The console's cost on a large key table: ATOMICPHASE_BENCH_KEYS keys
// (default 100 000; the docs quote 1 000 000), 99% finished and 1%
// unfinished (parked, unknown, abandoned: each went wrong, or is parked),
// over 1 000 scopes and three workflows, created a second apart. Each benchmark is one page view,
// rendered in full.
//
//	ATOMICPHASE_BENCH_KEYS=1000000 go test -run '^$' -bench . -benchtime 50x ./apui
func benchConsole(b *testing.B) (*httptest.Server, string) {
	b.Helper()
	n := 100_000
	if s := os.Getenv("ATOMICPHASE_BENCH_KEYS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	db := atomicphasetest.NewDB(b, nil)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
    recovery_point, state, response_status, response_header, response_body, created_at, updated_at, finished_at,
    parked_at, unknown_at, last_error, next_attempt_at, status)
SELECT 'tenant_' || (i % 1000), 'key-' || i, (ARRAY['checkout','payout','refund'])[1 + i % 3], '\x00'::bytea, 'POST', '/rides',
    CASE WHEN i % 100 = 0 THEN 'started' ELSE 'finished' END, '{"amount": 1200}',
    CASE WHEN i % 100 = 0 THEN NULL ELSE 201 END,
    CASE WHEN i % 100 = 0 THEN NULL ELSE '{"Content-Type": ["application/json"]}'::jsonb END,
    CASE WHEN i % 100 = 0 THEN NULL ELSE '{"id": 1}'::bytea END,
    t, t, CASE WHEN i % 100 = 0 THEN NULL ELSE t END,
    CASE WHEN i % 400 = 0 THEN t END, CASE WHEN i % 400 = 100 THEN t END,
    CASE WHEN i % 100 = 0 THEN 'phase "charge": card declined' END,
    -- an unfinished key that failed, or that the sweep's watermark passed, is due
    CASE WHEN i % 100 = 0 AND i % 400 <> 0 THEN t END,
    CASE WHEN i % 100 <> 0 THEN 'f' WHEN i % 400 = 0 THEN 'p' WHEN i % 400 = 100 THEN 'u' ELSE 'w' END
FROM generate_series(1, $1::int) AS i, LATERAL (SELECT now() - ($1::int - i) * interval '1 second' AS t) AS c`, n)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE idempotency_keys`)
	require.NoError(b, err)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(b, err)
	h, err := NewHandler(&Options{Runner: runner})
	require.NoError(b, err)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	// A cursor halfway down the table: a deep page.
	var mid time.Time
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT created_at FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2`,
		"tenant_"+strconv.Itoa(n/2%1000), "key-"+strconv.Itoa(n/2)).Scan(&mid))
	deep := url.Values{"after_t": {mid.UTC().Format(time.RFC3339Nano)}, "after_s": {"tenant_" + strconv.Itoa(n/2%1000)},
		"after_k": {"key-" + strconv.Itoa(n/2)}}
	return srv, deep.Encode()
}

func benchGet(b *testing.B, srv *httptest.Server, path string) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := http.Get(srv.URL + path)
		require.NoError(b, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(b, err)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
	}
}

func BenchmarkConsole(b *testing.B) {
	srv, deep := benchConsole(b)
	b.Run("overview", func(b *testing.B) { benchGet(b, srv, "/") })
	b.Run("keys/first-page", func(b *testing.B) { benchGet(b, srv, "/keys") })
	b.Run("keys/deep-page", func(b *testing.B) {
		benchGet(b, srv, "/keys?"+deep)
	})
	b.Run("keys/parked", func(b *testing.B) { benchGet(b, srv, "/keys?status=parked") })
	b.Run("keys/scope-error-text", func(b *testing.B) { benchGet(b, srv, "/keys?scope=tenant_0&error=declined&list=1") })
	b.Run("key", func(b *testing.B) { benchGet(b, srv, "/key?scope=tenant_400&key=key-400") })
}

// The console's memory on rows a client of the service made large: 48
// parked keys whose state is 1 MiB, and 48 finished ones whose stored
// response body is 1 MiB (a client can plant both). A page of the list and
// a bulk dry run read only the columns they show, so what they allocate
// does not follow the rows' size; B/op is one request, server and client.
//
//	go test -run '^$' -bench ConsoleLargeRows -benchmem ./apui
func BenchmarkConsoleLargeRows(b *testing.B) {
	db := atomicphasetest.NewDB(b, nil)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
    recovery_point, state, response_status, response_header, response_body, created_at, updated_at, finished_at,
    parked_at, last_error, status)
SELECT 'tenant', 'key-' || i, 'big', '\x00'::bytea, 'POST', '/big', CASE WHEN i % 2 = 0 THEN 'started' ELSE 'finished' END,
    CASE WHEN i % 2 = 0 THEN convert_to('{"blob": "' || repeat('x', 1 << 20) || '"}', 'UTF8') END,
    CASE WHEN i % 2 = 1 THEN 201 END,
    CASE WHEN i % 2 = 1 THEN '{"Content-Type": ["application/octet-stream"]}'::jsonb END,
    CASE WHEN i % 2 = 1 THEN convert_to(repeat('y', 1 << 20), 'UTF8') END,
    now() - (96 - i) * interval '1 second', now(), CASE WHEN i % 2 = 1 THEN now() END,
    CASE WHEN i % 2 = 0 THEN now() END, CASE WHEN i % 2 = 0 THEN 'phase "charge": card declined' END,
    CASE WHEN i % 2 = 0 THEN 'p' ELSE 'f' END
FROM generate_series(1, 96) AS i`)
	require.NoError(b, err)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(b, err)
	h, err := NewHandler(&Options{Runner: runner})
	require.NoError(b, err)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	b.Run("keys/page-of-96", func(b *testing.B) { benchGet(b, srv, "/keys?workflow=big&limit=100") })
	b.Run("api/keys/page-of-96", func(b *testing.B) { benchGet(b, srv, "/api/keys?workflow=big&limit=100") })
	b.Run("overview", func(b *testing.B) { benchGet(b, srv, "/") })
	b.Run("bulk-dry-run/48", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := http.Post(srv.URL+"/api/bulk/forget", "application/json",
				strings.NewReader(`{"filter":{"workflow":"big","status":"parked"},"dry_run":true}`))
			require.NoError(b, err)
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(b, err)
			resp.Body.Close()
			require.Equal(b, http.StatusOK, resp.StatusCode)
		}
	})
}
