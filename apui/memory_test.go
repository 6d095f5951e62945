package apui

import (
	"net/http"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// plantLargeRows adds n keys of scope "big" whose rows a client made
// large: the even ones parked with a 1 MiB state, the odd ones finished
// with a 1 MiB stored body.
func (b *testBundle) plantLargeRows(t *testing.T, n int) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, `
INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
    recovery_point, state, response_status, response_body, created_at, updated_at, finished_at, parked_at, status)
SELECT 'big', 'key-' || i, 'big', '\x00'::bytea, 'POST', '/big', CASE WHEN i % 2 = 0 THEN 'started' ELSE 'finished' END,
    CASE WHEN i % 2 = 0 THEN convert_to('{"blob": "' || repeat('x', 1 << 20) || '"}', 'UTF8') END,
    CASE WHEN i % 2 = 1 THEN 201 END, CASE WHEN i % 2 = 1 THEN convert_to(repeat('y', 1 << 20), 'UTF8') END,
    now(), now(), CASE WHEN i % 2 = 1 THEN now() END, CASE WHEN i % 2 = 0 THEN now() END,
    CASE WHEN i % 2 = 0 THEN 'p' ELSE 'f' END
FROM generate_series(1, $1::int) AS i`, n)
	require.NoError(t, err)
}

// allocated is what fn allocates, in bytes: this process's, so the test
// runs alone (not parallel), and its bound is far from both sides.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A list, the API's list, the overview and a bulk dry run read only what
// they show: sixteen keys holding a megabyte each cost them no megabyte.
// (BenchmarkConsoleLargeRows reports the figures.) Not parallel: it
// measures the process's allocations.
func TestListsReadOnlyWhatTheyShow(t *testing.T) {
	b := setup(t, nil)
	b.plantLargeRows(t, 16)
	var page keysJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?scope=big", "", "", &page))
	require.Len(t, page.Keys, 16)
	for _, k := range page.Keys {
		require.Zero(t, len(k.State), k.Key)
		if k.Response != nil {
			require.Zero(t, len(k.Response.Body), k.Key)
			require.Equal(t, 201, k.Response.Status)
		}
	}
	k := b.inspect(t, "big", "key-2")
	require.Greater(t, len(k.State), 1<<20, "a key's own page reads it whole")

	const bound = 4 << 20 // each request touches 16 MiB of rows
	for name, fn := range map[string]func(){
		"keys page": func() {
			code, _ := b.get(t, "/keys?scope=big&list=1")
			require.Equal(t, http.StatusOK, code)
		},
		"overview": func() {
			code, body := b.get(t, "/")
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "key-2", "the planted parked keys are recent trouble")
		},
		"api keys": func() {
			require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?scope=big", "", "", nil))
		},
		"bulk dry run": func() {
			var res bulkResult
			require.Equal(t, http.StatusOK, b.apiCall(t, "POST", "/api/bulk/forget", "application/json",
				`{"filter":{"scope":"big"},"dry_run":true}`, &res))
			require.Equal(t, 16, res.Selected)
		},
	} {
		fn() // warm: templates, connections
		require.Less(t, allocated(fn), uint64(bound), name)
	}
}
