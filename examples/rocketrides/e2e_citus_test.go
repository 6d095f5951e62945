package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// With CITUS_ROUTE=1, on Citus, the server routes each rider's requests to
// the worker holding the rider's shard: rides are booked and replayed as
// through the coordinator, one charge and one payout each.
func TestCitusRouteBooksThroughTheRidersWorker(t *testing.T) {
	t.Parallel()
	if !atomicphasetest.OnCitus() {
		t.Skip("needs the Citus test mode: set " + atomicphasetest.CitusURLEnv + " (docs/scale.md)")
	}
	w := newWorld(t)
	srv := w.start(t, "CITUS_ROUTE=1")
	require.Contains(t, srv.log.String(), "CITUS_ROUTE=1: each rider's requests go to its worker (2 workers)")
	const rides = 5
	for i := range rides {
		key := "routed-" + strconv.Itoa(i)
		first := retryUntilFinal(t, srv.url, "user@example.com", key, rideBody)
		ride := decodeBooked(t, first)
		again, err := post(srv.url, "user@example.com", key, rideBody)
		require.NoError(t, err)
		require.Equal(t, first.status, again.status)
		require.True(t, bytes.Equal(first.body, again.body), "the replay is the stored answer")
		require.Equal(t, 1, count(t, w.db, "SELECT count(*) FROM rides WHERE id = $1 AND bank_payout_id IS NOT NULL", ride.RideID))
	}
	require.Len(t, w.pay.Charges(), rides, "one charge per ride")
	require.Len(t, w.bank.Payouts(), rides, "one payout per ride")
}

// CITUS_ROUTE=1 against a PostgreSQL without Citus stops the start-up with
// what it needs.
func TestCitusRouteNeedsCitus(t *testing.T) {
	t.Parallel()
	if atomicphasetest.OnCitus() {
		t.Skip("on Citus, CITUS_ROUTE=1 is served")
	}
	db := atomicphasetest.NewDB(t, dbOptions)
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "ADDR=127.0.0.1:0", "CITUS_ROUTE=1", "ATOMICPHASE_FAULTS=")
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "CITUS_ROUTE=1 needs a Citus coordinator")
}
