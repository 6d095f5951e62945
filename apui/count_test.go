package apui

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A key parked while its call's outcome is unknown is parked: each screen
// that counts keys by status counts it once, under parked, as the key
// list's filter finds it (the overview, api/levels, the versions page and
// api/versions).
func TestEveryScreenCountsAParkedUnknownKeyAlike(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = now(), status = 'p' WHERE idempotency_key = 'unknown-1'`)
	require.NoError(t, err)
	k := b.inspect(t, "frank", "unknown-1")
	require.Equal(t, atomicphase.KeyParked, k.Status)
	require.NotNil(t, k.UnknownAt)

	listed := map[atomicphase.KeyStatus]int{}
	for _, s := range []atomicphase.KeyStatus{atomicphase.KeyParked, atomicphase.KeyUnknown} {
		var page keysJSON
		require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/keys?status="+string(s), "", "", &page))
		listed[s] = len(page.Keys)
	}
	require.Equal(t, map[atomicphase.KeyStatus]int{atomicphase.KeyParked: 5, atomicphase.KeyUnknown: 0}, listed)

	var levels levelsJSON
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/levels", "", "", &levels))
	byLevels := map[atomicphase.KeyStatus]int{}
	for _, l := range levels.Levels {
		byLevels[l.Status] += int(l.Count)
	}
	require.Equal(t, listed[atomicphase.KeyParked], byLevels[atomicphase.KeyParked], "api/levels")
	require.Equal(t, listed[atomicphase.KeyUnknown], byLevels[atomicphase.KeyUnknown], "api/levels")
	_, body := b.get(t, "/")
	require.Contains(t, text(body), "0 unknown 5 parked", "the overview")

	var vs struct {
		Versions []atomicphase.VersionStatus `json:"versions"`
	}
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/versions", "", "", &vs))
	parked, unknown := 0, 0
	for _, v := range vs.Versions {
		parked += v.Parked
		unknown += v.Unknown
	}
	require.Equal(t, listed[atomicphase.KeyParked], parked, "api/versions")
	require.Equal(t, listed[atomicphase.KeyUnknown], unknown, "api/versions")
	_, body = b.get(t, "/versions")
	require.Regexp(t, `label v\w+ buy_label → confirm [^|]*? 1 1 0 `, text(body), "the versions page: unfinished, parked, unknown")
}
