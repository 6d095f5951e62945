package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// TestRollingDeploy serves the same database with two releases of Rocket
// Rides at once, under load, with server kills: v1 (create_ride, charge,
// payout, send_receipt) and v2 (book_ride, formerly create_ride; charge; a
// new notify_driver; payout, whose record step now queues the receipt:
// send_receipt removed). Clients book rides against whichever server is up,
// retrying as a client does; a v1 server is killed mid-load and another
// started, then v2 servers take over and one is killed too. Every key
// finishes, with one ride, one charge, one payout and one receipt per ride;
// each ride ran under the release it started with (v2's have the driver's
// notification, v1's none); and at the end v1 is drained.
func TestRollingDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("a rolling deploy under load; -short skips it")
	}
	if os.Getenv(bouncerEnv) != "" {
		// Three servers, each with its receipt workers, need more than the
		// test PgBouncer's four server connections; the direct run covers
		// the deploy, and the other end-to-end tests PgBouncer.
		t.Skip("three servers at once outgrow the test PgBouncer's pool; run without " + bouncerEnv)
	}
	t.Parallel()
	w := newWorld(t)
	fast := []string{"SWEEP_INTERVAL=100ms"}
	start := func(release string, env ...string) *server {
		return w.start(t, append(append([]string{"RIDES_RELEASE=" + release}, fast...), env...)...)
	}

	var mu sync.Mutex
	var live []*server
	setLive := func(servers ...*server) {
		mu.Lock()
		defer mu.Unlock()
		live = servers
	}
	pick := func() string {
		mu.Lock()
		defer mu.Unlock()
		return live[rand.IntN(len(live))].url
	}

	// v1 alone; one v1 server dies at its first payout, after the bank
	// paid: its key is finished by another server (v1 or, later, v2).
	a1 := start("v1", "ATOMICPHASE_FAULTS=create_ride/payout:after-foreign:exit")
	a2 := start("v1")
	setLive(a1, a2)

	// Clients book rides, one after another, until the deploy is over.
	const clients = 6
	type answer struct {
		key string
		r   reply
	}
	var answersMu sync.Mutex
	var answers []answer
	var clientsDone sync.WaitGroup
	stop := make(chan struct{})
	progress := make(chan struct{}, 1024)
	for c := range clients {
		clientsDone.Add(1)
		go func() {
			defer clientsDone.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("deploy-%d-%d", c, i)
				r := bookUntilFinal(pick, key)
				answersMu.Lock()
				answers = append(answers, answer{key, r})
				answersMu.Unlock()
				progress <- struct{}{}
			}
		}()
	}
	waitRides := func(n int) {
		for range n {
			select {
			case <-progress:
			case <-time.After(90 * time.Second):
				t.Fatalf("no ride finished for 90s; servers' logs:\n%s\n%s", a1.log, a2.log)
			}
		}
	}

	waitRides(6)
	<-a1.exited // killed by its fault at the first payout
	versionsStranded := versionsTable(t, w)
	b1 := start("v2")
	setLive(a2, b1) // v1 and v2 serve together
	waitRides(12)
	versionsMidway := versionsTable(t, w)
	b2 := start("v2")
	setLive(b1, b2)
	require.NoError(t, a2.cmd.Process.Kill()) // v1's last server, mid-load
	waitRides(12)
	require.NoError(t, b1.cmd.Process.Kill()) // a v2 server too
	b3 := start("v2")
	setLive(b2, b3)
	waitRides(12)
	close(stop)
	clientsDone.Wait()

	// The invariants: every ride answered 201 once, and replayed the same.
	rides := map[string]booked{}
	for _, a := range answers {
		rides[a.key] = decodeBooked(t, a.r)
	}
	require.Len(t, rides, len(answers))
	require.Len(t, w.pay.Charges(), len(rides), "one charge per ride")
	require.Equal(t, len(rides), count(t, w.db, "SELECT count(*) FROM rides"))
	require.Len(t, w.bank.Payouts(), len(rides), "one payout per ride")
	for ref, n := range w.bank.PerReference() {
		require.Equal(t, 1, n, "payouts for reference %s", ref)
	}
	require.Len(t, w.waitReceipts(t, len(rides)), len(rides), "one receipt per ride")
	require.Zero(t, count(t, w.db, "SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL"), "every key finished")

	// Each ride ran under its own release: v2's notify the driver.
	v1, v2 := versionsOf(t, w)
	require.Equal(t, count(t, w.db, `SELECT count(*) FROM idempotency_keys WHERE workflow_version = $1`, v2),
		count(t, w.db, `SELECT count(*) FROM audit_records WHERE action = 'driver_notified'`))
	require.Positive(t, count(t, w.db, `SELECT count(*) FROM idempotency_keys WHERE workflow_version = $1`, v1), "v1 served rides")
	require.Positive(t, count(t, w.db, `SELECT count(*) FROM idempotency_keys WHERE workflow_version = $1`, v2), "v2 served rides")
	require.Zero(t, count(t, w.db, `SELECT count(*) FROM (SELECT resource_id FROM audit_records WHERE action = 'driver_notified'
		GROUP BY 1 HAVING count(*) > 1) d`), "one notification per v2 ride")

	t.Logf("atomicphase versions, once a v1 server died inside a payout:\n%s", versionsStranded)
	t.Logf("atomicphase versions, while v1 and v2 served together:\n%s", versionsMidway)
	t.Logf("atomicphase versions, at the end:\n%s", versionsTable(t, w))
	for _, v := range listVersions(t, w) {
		require.True(t, v.Drained(), "version %s drained", v.Version)
	}
}

// bookUntilFinal books a ride with key against the servers pick returns,
// as a client does: connection errors, 409 and 5xx are retried, with the
// same key, at whichever server is up.
func bookUntilFinal(pick func() string, key string) reply {
	for range 600 {
		r, err := post(pick(), "user@example.com", key, rideBody)
		switch {
		case err != nil || r.status >= 500:
			time.Sleep(50 * time.Millisecond)
		case r.status == http.StatusConflict:
			time.Sleep(100 * time.Millisecond)
		default:
			return r
		}
	}
	return reply{status: 0, body: []byte("no final answer after 600 attempts")}
}

// versionsOf returns the versions of v1's and v2's create_ride.
func versionsOf(t *testing.T, w *world) (v1, v2 string) {
	t.Helper()
	for _, v := range listVersions(t, w) {
		if len(v.Phases) > 0 && v.Phases[0] == "create_ride" {
			v1 = v.Version
		} else if len(v.Phases) > 0 {
			v2 = v.Version
		}
	}
	require.NotEmpty(t, v1)
	require.NotEmpty(t, v2)
	return v1, v2
}

func listVersions(t *testing.T, w *world) []atomicphase.VersionStatus {
	t.Helper()
	r, err := atomicphase.NewRunner(w.db.Pool, nil)
	require.NoError(t, err)
	vs, err := r.Versions(context.Background())
	require.NoError(t, err)
	return vs
}

// versionsTable is `atomicphase versions` against the test's database:
// the CLI itself when it builds here, else the same table from
// Runner.Versions.
func versionsTable(t *testing.T, w *world) string {
	t.Helper()
	if cli := cliBinary(); cli != "" {
		out, err := exec.Command(cli, "versions", "--database-url", w.db.URL).CombinedOutput()
		if err == nil {
			return string(out)
		}
		t.Logf("atomicphase versions: %v: %s", err, out)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKFLOW\tVERSION\tDEPLOYED\tUNFINISHED\tPARKED\tUNKNOWN\tPHASES")
	for _, v := range listVersions(t, w) {
		fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%d\t%d\t%v\n", v.Workflow, v.Version, v.Deployed, v.Unfinished, v.Parked, v.Unknown, v.Phases)
	}
	_ = tw.Flush()
	return b.String()
}

var (
	cliOnce sync.Once
	cliPath string
)

// cliBinary builds the operator CLI from this repository, once; "" when it
// does not build here (the example copied out of the repository).
func cliBinary() string {
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "atomicphase-cli")
		if err != nil {
			return
		}
		out := filepath.Join(dir, "atomicphase")
		cmd := exec.Command("go", "build", "-o", out, ".")
		cmd.Dir = filepath.Join("..", "..", "cmd", "atomicphase")
		if err := cmd.Run(); err == nil {
			cliPath = out
		}
	})
	return cliPath
}
