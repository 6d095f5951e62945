package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// newTestBench gives the test a bench on a database of its own from the
// test harness (its fast settings: the counts do not depend on them), with
// maxClients connections per design, and the designs opts vary.
func newTestBench(t *testing.T, maxClients int, opts designOpts) *bench {
	t.Helper()
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{
		SetupID: fmt.Sprintf("bench-compare-%x", sha256.Sum256([]byte(schema)))[:22],
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, schema)
			return err
		},
	})
	fake, err := fakestripe.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	b, err := newBench(context.Background(), cfg, db.Pool, fake, maxClients, opts)
	require.NoError(t, err)
	t.Cleanup(b.close)
	return b
}

// TestMeasureCountsAndVerifies runs every design briefly with one client,
// as the command does, and checks what each request cost.
func TestMeasureCountsAndVerifies(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts designOpts
	}{
		{"as it is", designOpts{}},
		{"read-first", designOpts{readFirst: true}},
		{"rtt", designOpts{rtt: time.Millisecond}},
		{"read-first and rtt", designOpts{readFirst: true, rtt: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			measureCountsAndVerifies(t, tc.opts)
		})
	}
}

func measureCountsAndVerifies(t *testing.T, opts designOpts) {
	ctx := context.Background()
	b := newTestBench(t, 1, opts)
	require.NoError(t, b.createFinished(ctx, 20))
	want := map[string]struct{ trips, commits int64 }{
		"a":  {2, 2}, // the key and ride; the batch with the charge, outbox row and response
		"b":  {2, 2}, // the key's read, its recording and create_ride; charge's record step with the response
		"c":  {1, 0}, // the batch the key's read heads, which finds it finished
		"c'": {1, 0}, // the key's read
		"d":  {1, 0},
	}
	// What tells the replays apart: an unmarked one's round trip is the
	// first unit's batch, a marked one's the key's read alone.
	batches := map[string]int64{"a": 1, "c": 1, "c'": 0, "d": 0}
	if opts.readFirst {
		// The key's read, then as without it.
		want["a"] = struct{ trips, commits int64 }{3, 2}
	}
	for _, d := range b.designs {
		// The warm-up fills the connection's statement cache.
		_, err := b.measure(ctx, d, "w", 1, 100*time.Millisecond, nil)
		require.NoError(t, err, d.name)
		res, err := b.measure(ctx, d, "m", 1, 250*time.Millisecond, nil)
		require.NoError(t, err, d.name)
		require.Positive(t, res.requests, d.name)
		w := want[d.code]
		require.Equal(t, w.trips*res.requests, res.counts.trips, "(%s) %s: round trips for %d requests", d.code, d.name, res.requests)
		require.Equal(t, w.commits*res.requests, res.counts.commits, "(%s) %s: commits for %d requests", d.code, d.name, res.requests)
		if b, ok := batches[d.code]; ok {
			require.Equal(t, b*res.requests, res.counts.batches, "(%s) %s: batches for %d requests", d.code, d.name, res.requests)
		}
		// Transactions that wrote, counted by the server: at least the
		// tracer's commits (another test process may share the server).
		require.GreaterOrEqual(t, res.xids, w.commits*res.requests, d.name)
		require.LessOrEqual(t, res.p50, res.p99)
		if d.fresh {
			require.Positive(t, res.walBytes, d.name)
		}
	}
	if opts.rtt > 0 {
		// Every design's pool went through the proxy, which held each
		// chunk at least its time.
		held, n := b.proxy.meanHeld()
		require.Positive(t, n)
		require.GreaterOrEqual(t, held, opts.rtt/2)
	} else {
		require.Nil(t, b.proxy)
	}
}

// TestMeasureFailsAWrongAnswer checks that the verification catches a
// design that answers fast but wrong.
func TestMeasureFailsAWrongAnswer(t *testing.T) {
	ctx := context.Background()
	b := newTestBench(t, 1, designOpts{})
	a := b.design("a")
	for i, tc := range []struct {
		name, want string
		wrong      func(ctx context.Context, c *client) error
	}{
		{"no outbox row", "outbox rows", func(ctx context.Context, c *client) error {
			_, err := b.admin.Exec(ctx, `DELETE FROM outbox WHERE id = (SELECT max(id) FROM outbox)`)
			return err
		}},
		{"a second charge", "charges at the payment API", func(ctx context.Context, c *client) error {
			_, err := b.pay.Charge(ctx, c.user.customer, fmt.Sprintf("again-%d-%d", c.id, c.seq), "again", amount, currency)
			return err
		}},
		{"a duplicate ride", "rides", func(ctx context.Context, c *client) error {
			_, err := b.admin.Exec(ctx, `INSERT INTO rides (idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
				VALUES ($1, $2, 0, 0, 0, 0)`, fmt.Sprintf("ride-%d", c.seq), c.user.id)
			return err
		}},
		{"an unfinished key", "unfinished keys", func(ctx context.Context, c *client) error {
			_, err := b.admin.Exec(ctx, `UPDATE hw_idempotency_keys SET response_status = NULL
				WHERE scope = $1 AND idempotency_key = $2`, c.user.email, fmt.Sprintf("ride-%d", c.seq))
			return err
		}},
	} {
		label := fmt.Sprintf("bad%d", i) // each case's clients are new users
		t.Run(tc.name, func(t *testing.T) {
			wrong := &design{code: "a", name: "wrong: " + tc.name, fresh: true, pool: a.pool, trace: a.trace,
				do: func(ctx context.Context, c *client) error {
					if err := a.do(ctx, c); err != nil {
						return err
					}
					return tc.wrong(ctx, c)
				}}
			_, err := b.measure(ctx, wrong, label, 1, 50*time.Millisecond, nil)
			require.ErrorContains(t, err, "VERIFICATION FAILED")
			require.ErrorContains(t, err, tc.want)
			// Leave no unfinished key to the next case.
			_, err = b.admin.Exec(ctx, `UPDATE hw_idempotency_keys SET response_status = 201 WHERE response_status IS NULL`)
			require.NoError(t, err)
		})
	}
}

// TestMeasureFailsAWrongReplay checks that the verification after a
// replay design, marked or not, catches one that changed anything.
func TestMeasureFailsAWrongReplay(t *testing.T) {
	ctx := context.Background()
	b := newTestBench(t, 1, designOpts{})
	require.NoError(t, b.createFinished(ctx, 5))
	for _, code := range []string{"c", "c'"} {
		r := b.design(code)
		for _, tc := range []struct {
			name, want string
			wrong      func(ctx context.Context) error
		}{
			{"a ride", "replays added", func(ctx context.Context) error {
				_, err := b.admin.Exec(ctx, `INSERT INTO rides (idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
					SELECT 'extra', id, 0, 0, 0, 0 FROM users LIMIT 1`)
				return err
			}},
			{"a charge", "the payment API got", func(ctx context.Context) error {
				_, err := b.pay.Charge(ctx, "cus_extra", "extra-"+strconv.FormatInt(time.Now().UnixNano(), 10), "extra", amount, currency)
				return err
			}},
		} {
			t.Run(code+" "+tc.name, func(t *testing.T) {
				wrong := &design{code: code, name: "wrong: " + tc.name, pool: r.pool, trace: r.trace,
					do: func(ctx context.Context, c *client) error {
						if err := r.do(ctx, c); err != nil {
							return err
						}
						return tc.wrong(ctx)
					}}
				_, err := b.measure(ctx, wrong, "bad", 1, 50*time.Millisecond, nil)
				require.ErrorContains(t, err, "VERIFICATION FAILED")
				require.ErrorContains(t, err, tc.want)
			})
		}
	}
}

// TestTracerCounts checks the tracer's rules on statements the designs do
// not send: a write in autocommit, a batch without BEGIN (its implicit
// transaction commits once), a read, and a transaction begun by pgx.
func TestTracerCounts(t *testing.T) {
	ctx := context.Background()
	b := newTestBench(t, 1, designOpts{})
	pool, tr := b.design("d").pool, b.design("d").trace
	step := func(what string, trips, commits, batches int64, f func() error) {
		t.Helper()
		before := tr.snapshot()
		require.NoError(t, f(), what)
		// Warm: the second run of the same statements prepares nothing.
		before = tr.snapshot()
		require.NoError(t, f(), what)
		got := tr.snapshot().minus(before)
		require.Equal(t, counts{trips: trips, commits: commits, batches: batches}, got, what)
	}
	step("a read", 1, 0, 0, func() error {
		var n int
		return pool.QueryRow(ctx, "SELECT 1").Scan(&n)
	})
	step("an autocommit insert", 1, 1, 0, func() error {
		_, err := pool.Exec(ctx, "INSERT INTO users (email, stripe_customer_id) VALUES (gen_random_uuid()::text, 'c')")
		return err
	})
	step("a batch without BEGIN, writing twice", 1, 1, 1, func() error {
		bt := &pgx.Batch{}
		bt.Queue("INSERT INTO users (email, stripe_customer_id) VALUES (gen_random_uuid()::text, 'c')")
		bt.Queue("SELECT 1")
		bt.Queue("UPDATE users SET stripe_customer_id = 'd' WHERE false")
		return pool.SendBatch(ctx, bt).Close()
	})
	step("a read-only batch", 1, 0, 1, func() error {
		bt := &pgx.Batch{}
		bt.Queue("SELECT 1")
		bt.Queue("SELECT 2")
		return pool.SendBatch(ctx, bt).Close()
	})
	step("pgx.BeginFunc with a write", 3, 1, 0, func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO users (email, stripe_customer_id) VALUES (gen_random_uuid()::text, 'c')")
			return err
		})
	})
	step("a rolled-back transaction", 3, 0, 0, func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO users (email, stripe_customer_id) VALUES (gen_random_uuid()::text, 'c')"); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{1, 8, 32}, o.clients)
	require.Equal(t, 5, o.rounds)
	require.Equal(t, 3*time.Second, o.duration)

	require.Zero(t, o.rtt)
	require.False(t, o.readFirst)

	o, err = parseFlags([]string{"-clients", "2, 4", "-rounds", "1", "-duration", "1s", "-pgss", "-cpuprofile", "x.prof", "-memprofile", "m.prof", "-read-first"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{2, 4}, o.clients)
	require.True(t, o.pgss)
	require.True(t, o.readFirst)
	require.Zero(t, o.rtt)
	require.Equal(t, "x.prof", o.cpuprofile)
	require.Equal(t, "m.prof", o.memprofile)

	o, err = parseFlags([]string{"-rtt", "500us", "-read-first"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 500*time.Microsecond, o.rtt)
	require.True(t, o.readFirst)
	o, err = parseFlags([]string{"-rtt", "0"}, io.Discard)
	require.NoError(t, err)
	require.Zero(t, o.rtt)

	for _, bad := range [][]string{{"-clients", "0"}, {"-clients", "x"}, {"-rounds", "0"}, {"-duration", "0s"}, {"extra"},
		{"-rtt", "-1ms"}, {"-rtt", "x"}, {"-rtt", "500"},
		{"-assume-new-keys"}, // removed: WorkflowOpts.AssumeNewKeys does nothing now
	} {
		_, err := parseFlags(bad, io.Discard)
		require.Error(t, err, "%q", bad)
	}
}

// TestRoundOrderKeepsPairsTogether checks that every round runs every
// design once, each ratio's two designs back to back.
func TestRoundOrderKeepsPairsTogether(t *testing.T) {
	ds := []*design{{code: "a"}, {code: "b"}, {code: "c"}, {code: "c'"}, {code: "d"}}
	firsts := map[string]bool{}
	for r := 1; r <= 4; r++ {
		var codes []string
		for _, d := range roundOrder(ds, r) {
			codes = append(codes, d.code)
		}
		require.ElementsMatch(t, []string{"a", "b", "c", "c'", "d"}, codes, "round %d", r)
		for _, pair := range [][2]string{{"a", "b"}, {"c", "d"}, {"c'", "d"}} {
			i, j := slices.Index(codes, pair[0]), slices.Index(codes, pair[1])
			require.Equal(t, 1, max(i, j)-min(i, j), "round %d: %q", r, codes)
		}
		firsts[codes[0]] = true
	}
	require.Len(t, firsts, 4, "four designs go first in four rounds")
}

func TestProfileFile(t *testing.T) {
	require.Equal(t, "/tmp/ap.prof", profileFile("/tmp/ap.prof", "b"))
	require.Equal(t, "/tmp/ap-handwritten.prof", profileFile("/tmp/ap.prof", "a"))
	require.Equal(t, "ap-replay", profileFile("ap", "c"))
	require.Equal(t, "/tmp/ap-replay-marked.prof", profileFile("/tmp/ap.prof", "c'"))
	require.Equal(t, "x.y/ap-pkselect.out", profileFile("x.y/ap.out", "d"))
}

func TestServerCPUReadsAProcessAndItsChildren(t *testing.T) {
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skip("no /proc/PID/schedstat here")
	}
	own, ok := serverCPU(os.Getpid())
	require.True(t, ok)
	require.Positive(t, own)
	_, ok = serverCPU(1 << 30)
	require.False(t, ok, "no such process")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(dir+"/postmaster.pid", []byte("4242\n/data\n1700000000\n5432\n"), 0o600))
	pid, err := postmasterPID(dir)
	require.NoError(t, err)
	require.Equal(t, 4242, pid)
}

func TestMachineCPU(t *testing.T) {
	busy, total, ok := machineCPU()
	if !ok {
		t.Skip("no /proc/stat here")
	}
	require.Positive(t, total)
	require.LessOrEqual(t, busy, total)
	require.Equal(t, "other work 5/12% of the CPUs", othersLabel([]float64{0.05, 0.123}))
	require.Equal(t, "other work unknown", othersLabel([]float64{0.05, -1}))
}

// TestWALTop reports the WAL written since a position by record type, per
// request, and says so when none was written.
func TestWALTop(t *testing.T) {
	ctx := context.Background()
	b := newTestBench(t, 1, designOpts{})
	// Other tests write to the same server at any time: a start past the
	// WAL written so far is one that none was written since.
	var future, start string
	require.NoError(t, b.admin.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() + 1073741824)::text, pg_current_wal_insert_lsn()::text").
		Scan(&future, &start))
	var out strings.Builder
	require.NoError(t, walTop(ctx, &out, b.admin, future, &cellResult{requests: 1}, 8))
	if strings.Contains(out.String(), "unavailable") {
		t.Skipf("no pg_walinspect here: %s", out.String())
	}
	require.Equal(t, "  WAL: none written\n", out.String())

	// (The test server commits without waiting for its WAL to be flushed,
	// which pg_walinspect reads only up to; this session waits.)
	_, err := b.admin.Exec(ctx, `SET synchronous_commit = on; CREATE TABLE waltop_test (x int); INSERT INTO waltop_test VALUES (1)`)
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, walTop(ctx, &out, b.admin, start, &cellResult{requests: 1}, 8))
	require.Contains(t, out.String(), "Heap/INSERT", out.String())
	require.Contains(t, out.String(), "Transaction/COMMIT", out.String())
	require.Contains(t, out.String(), "WAL, all records:", out.String())
}
