package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/internal/benchkit"
)

// design is one way of answering the request, on a pool of its own whose
// tracer counts what it sends.
type design struct {
	code  string // a, b, c, c', d
	name  string
	fresh bool // each request is a new key (a, b); else a replay of a finished one (c, c', d)
	pool  *pgxpool.Pool
	trace *tracer
	// do answers one request of c.
	do func(ctx context.Context, c *client) error
}

// client is one concurrent caller in a measurement.
type client struct {
	id   int
	user *user // fresh designs: the caller, whose keys are its own
	seq  int   // requests made
	body []byte
	next int // replay designs: the index of the next finished key
	lat  []time.Duration
}

// nextKey returns a key the client has not used before.
func (c *client) nextKey() string {
	c.seq++
	return "ride-" + strconv.Itoa(c.seq)
}

// finishedKey is a key of the replay pool.
type finishedKey struct {
	scope, key string
	body, resp []byte // the request and the stored response
}

// bench is everything a measurement needs.
type bench struct {
	admin   *pgxpool.Pool // untraced: set-up and verification
	fake    *fakestripe.Server
	pay     *benchkit.Payments
	users   *users
	wf      *atomicphase.Workflow[rideState]
	designs []*design // a, b, c, c', d, in that order
	replay  []finishedKey
	// proxy is the delayProxy between the designs' pools and the server;
	// nil without designOpts.rtt.
	proxy *delayProxy
	// latencies are the clients' buffers, reused from cell to cell.
	latencies [][]time.Duration
	// serverCPU reads the server's CPU time; nil when it cannot be read
	// (a server bench-compare did not start).
	serverCPU func() time.Duration
}

// poolFor opens a pool for a design with base's settings: maxConns
// connections, counted by a tracer of its own.
func poolFor(ctx context.Context, base *pgxpool.Config, maxConns int) (*pgxpool.Pool, *tracer, error) {
	cfg := base.Copy()
	tr := &tracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = int32(maxConns)
	cfg.MaxConnIdleTime = time.Hour
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	return pool, tr, err
}

// newBench opens the five designs' pools with base's settings, on a
// database with the atomicphase schema and the bench's own (see schema);
// maxClients is the largest number of concurrent clients to be measured;
// opts vary the designs (designOpts). With opts.rtt, every pool connects
// through a delayProxy of its own; admin connects as it was opened.
func newBench(ctx context.Context, base *pgxpool.Config, admin *pgxpool.Pool, fake *fakestripe.Server, maxClients int, opts designOpts) (*bench, error) {
	b := &bench{admin: admin, fake: fake, pay: benchkit.NewPayments(fake.URL, 512), users: &users{m: map[string]*user{}}}
	b.wf = rideWorkflow(b.users, b.pay)
	if opts.rtt > 0 {
		cfg, proxy, err := throughProxy(base, opts.rtt)
		if err != nil {
			return nil, err
		}
		base, b.proxy = cfg, proxy
	}
	pools := make([]*pgxpool.Pool, 5)
	tracers := make([]*tracer, 5)
	for i := range pools {
		var err error
		if pools[i], tracers[i], err = poolFor(ctx, base, maxClients); err != nil {
			b.close()
			return nil, err
		}
		// Kept as they open, so that close closes them on a later failure.
		b.designs = append(b.designs, &design{pool: pools[i], trace: tracers[i]})
	}
	apRunner, err := atomicphase.NewRunner(pools[1], nil)
	if err != nil {
		b.close()
		return nil, err
	}
	replayRunner, err := atomicphase.NewRunner(pools[2], nil)
	if err != nil {
		b.close()
		return nil, err
	}
	markedRunner, err := atomicphase.NewRunner(pools[3], nil)
	if err != nil {
		b.close()
		return nil, err
	}
	a, ap, rp, rm, pk := b.designs[0], b.designs[1], b.designs[2], b.designs[3], b.designs[4]
	a.code, a.name, a.fresh = "a", "hand-written pgx", true
	if opts.readFirst {
		a.name = "hand-written + read"
	}
	a.do = func(ctx context.Context, c *client) error {
		c.body = rideBody(c.body, c.id, c.seq+1)
		_, err := handWritten(ctx, a.pool, b.pay, c.user, c.nextKey(), c.body, opts.readFirst)
		return err
	}
	ap.code, ap.name, ap.fresh = "b", "atomicphase", true
	ap.do = func(ctx context.Context, c *client) error {
		c.body = rideBody(c.body, c.id, c.seq+1)
		_, err := runAtomicphase(ctx, apRunner, b.wf, c.user.email, c.nextKey(), c.body, false, false)
		return err
	}
	// (c) and (c') send the same replays, unmarked and marked as retries.
	replay := func(runner *atomicphase.Runner, retry bool) func(ctx context.Context, c *client) error {
		return func(ctx context.Context, c *client) error {
			k := b.nextFinished(c)
			body, err := runAtomicphase(ctx, runner, b.wf, k.scope, k.key, k.body, retry, true)
			if err == nil && string(body) != string(k.resp) {
				err = fmt.Errorf("replay of %s/%s: body %q, stored %q", k.scope, k.key, body, k.resp)
			}
			return err
		}
	}
	rp.code, rp.name, rp.do = "c", "atomicphase replay", replay(replayRunner, false)
	rm.code, rm.name, rm.do = "c'", "replay (marked)", replay(markedRunner, true)
	pk.code, pk.name = "d", "PK select (pgx)"
	pk.do = func(ctx context.Context, c *client) error {
		k := b.nextFinished(c)
		return pkSelect(ctx, pk.pool, k.scope, k.key, k.resp)
	}
	return b, nil
}

// close closes the designs' pools, then the proxy they connect through.
func (b *bench) close() {
	for _, d := range b.designs {
		d.pool.Close()
	}
	if b.proxy != nil {
		_ = b.proxy.Close()
	}
}

// design returns the design named by code, one of the codes newBench
// gives; any other is a mistake in this command.
func (b *bench) design(code string) *design {
	for _, d := range b.designs {
		if d.code == code {
			return d
		}
	}
	panic("no design " + code)
}

// nextFinished returns the next finished key c replays, going round the
// replay pool.
func (b *bench) nextFinished(c *client) *finishedKey {
	k := &b.replay[c.next]
	c.next = (c.next + 1) % len(b.replay)
	return k
}

// createFinished creates the replay pool: n keys finished through
// atomicphase (on the replay design's pool, before anything is counted),
// spread over a few users, verified like any measurement.
func (b *bench) createFinished(ctx context.Context, n int) error {
	const nUsers = 8
	emails := make([]string, nUsers)
	for i := range emails {
		emails[i] = fmt.Sprintf("bench-replay-%d", i)
	}
	us, err := b.users.create(ctx, b.admin, emails)
	if err != nil {
		return err
	}
	runner, err := atomicphase.NewRunner(b.design("c").pool, nil)
	if err != nil {
		return err
	}
	before, err := b.snapshotDB(ctx)
	if err != nil {
		return err
	}
	keys := make([]finishedKey, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, nUsers)
	for w := range nUsers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || errs[w] != nil {
					return
				}
				k := finishedKey{scope: us[i%nUsers].email, key: "ride-" + strconv.Itoa(i), body: rideBody(nil, w, i)}
				k.resp, errs[w] = runAtomicphase(ctx, runner, b.wf, k.scope, k.key, k.body, false, false)
				keys[i] = k
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.replay = keys
	return b.verifyFresh(ctx, b.design("b"), us, int64(n), before)
}

// cellResult is one measurement: one design at one concurrency, for a
// fixed duration.
type cellResult struct {
	design   string
	clients  int
	requests int64
	elapsed  time.Duration
	p50, p99 time.Duration
	counts   counts        // the design's pool's tracer, over the measurement
	xids     int64         // transaction ids the server assigned: transactions that wrote
	walBytes int64         // WAL the server inserted
	mallocs  uint64        // heap allocations in this process (clients and the fake payment API)
	cpu      time.Duration // CPU time of this process, user and system
	// serverCPU is the CPU time of the server's processes (see
	// serverCPU), -1 when unknown.
	serverCPU time.Duration
	// others is the share of the machine's CPU time that went to neither
	// this process nor the server (other work, or the hypervisor's steal),
	// -1 when unknown.
	others float64
}

// perSecond is the measurement's throughput: requests answered a second.
func (r *cellResult) perSecond() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// dbSnapshot is what the server and the fake payment API have done so far.
type dbSnapshot struct {
	xid      int64  // the next transaction id
	lsn      string // the WAL insert position
	rides    int64
	outbox   int64
	charges  int // distinct charges at the fake payment API
	requests int // charge requests it received
}

// snapshotDB reads where the server and the payment API stand.
func (b *bench) snapshotDB(ctx context.Context) (dbSnapshot, error) {
	s := dbSnapshot{charges: len(b.fake.Charges()), requests: b.fake.Requests()}
	err := b.admin.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
		pg_current_wal_insert_lsn()::text, (SELECT count(*) FROM rides), (SELECT count(*) FROM outbox)`).
		Scan(&s.xid, &s.lsn, &s.rides, &s.outbox)
	return s, err
}

// hooks run around a measurement's requests, for diagnostics: before just
// before the clients start, after as soon as they are done (before the
// verification's queries).
type hooks struct {
	before func() error
	after  func(*cellResult) error
}

// measure runs d with n concurrent clients for dur, then verifies the
// database and the payment API. label names the cell in users' emails. h
// may be nil.
func (b *bench) measure(ctx context.Context, d *design, label string, n int, dur time.Duration, h *hooks) (*cellResult, error) {
	if h == nil {
		h = &hooks{}
	}
	clients := make([]*client, n)
	var us []*user
	if d.fresh {
		emails := make([]string, n)
		for i := range emails {
			emails[i] = fmt.Sprintf("bench-%s-%s-%02d", label, d.code, i)
		}
		var err error
		if us, err = b.users.create(ctx, b.admin, emails); err != nil {
			return nil, err
		}
	} else if len(b.replay) == 0 {
		return nil, errors.New("no finished keys to replay")
	}
	for len(b.latencies) < n {
		b.latencies = append(b.latencies, make([]time.Duration, 0, 1<<15))
	}
	for i := range clients {
		clients[i] = &client{id: i, lat: b.latencies[i][:0]}
		if d.fresh {
			clients[i].user = us[i]
		} else {
			clients[i].next = i * len(b.replay) / n
		}
	}
	before, err := b.snapshotDB(ctx)
	if err != nil {
		return nil, err
	}
	if h.before != nil {
		if err := h.before(); err != nil {
			return nil, err
		}
	}
	runtime.GC()
	// Read in this order, and the reverse after, so that each reading
	// stays out of the others' windows.
	busy0, total0, machineOK := machineCPU()
	var srv0, srv1 time.Duration
	if b.serverCPU != nil {
		srv0 = b.serverCPU()
	}
	cpu0 := processCPU()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	tr0 := d.trace.snapshot()

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(dur)
	for _, c := range clients {
		wg.Go(func() {
			for cctx.Err() == nil {
				t0 := time.Now()
				if t0.After(deadline) {
					return
				}
				if err := d.do(cctx, c); err != nil {
					once.Do(func() {
						firstErr = fmt.Errorf("(%s) %s, client %d, request %d: %w", d.code, d.name, c.id, c.seq, err)
						cancel()
					})
					return
				}
				c.lat = append(c.lat, time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	tr1 := d.trace.snapshot()
	runtime.ReadMemStats(&mem1)
	cpu1 := processCPU()
	if b.serverCPU != nil {
		srv1 = b.serverCPU()
	}
	busy1, total1, ok := machineCPU()
	machineOK = machineOK && ok
	if firstErr != nil {
		return nil, firstErr
	}

	res := &cellResult{design: d.code, clients: n, elapsed: elapsed, counts: tr1.minus(tr0),
		mallocs: mem1.Mallocs - mem0.Mallocs, cpu: cpu1 - cpu0, serverCPU: -1, others: -1}
	if b.serverCPU != nil {
		res.serverCPU = srv1 - srv0
		if machineOK && total1 > total0 {
			res.others = max(0, float64(busy1-busy0-res.cpu-res.serverCPU)/float64(total1-total0))
		}
	}
	var all []time.Duration
	for i, c := range clients {
		all = append(all, c.lat...)
		b.latencies[i] = c.lat // keep a grown buffer
	}
	res.requests = int64(len(all))
	if res.requests == 0 {
		return nil, fmt.Errorf("(%s) %s: no request finished in %s", d.code, d.name, dur)
	}
	slices.Sort(all)
	res.p50, res.p99 = benchkit.Percentile(all, 0.50), benchkit.Percentile(all, 0.99)
	if h.after != nil {
		if err := h.after(res); err != nil {
			return nil, err
		}
	}
	if err := b.admin.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - $1,
		pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $2::pg_lsn)::bigint`, before.xid, before.lsn).
		Scan(&res.xids, &res.walBytes); err != nil {
		return nil, err
	}
	if d.fresh {
		err = b.verifyFresh(ctx, d, us, res.requests, before)
	} else {
		err = b.verifyReplay(ctx, before)
	}
	if err != nil {
		return nil, fmt.Errorf("VERIFICATION FAILED after (%s) %s with %d clients: %w", d.code, d.name, n, err)
	}
	return res, nil
}

// machineCPU reads the first line of /proc/stat: the time all CPUs spent
// busy (everything but idle and iowait; steal, the time the hypervisor gave
// to other machines, included) and in all.
func machineCPU() (busy, total time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	// user nice system idle iowait irq softirq steal [guest guest_nice],
	// in USER_HZ ticks, which Linux fixes at 100 a second in /proc.
	const tick = 10 * time.Millisecond
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += time.Duration(n) * tick
		if i != 3 && i != 4 {
			busy += time.Duration(n) * tick
		}
	}
	return busy, total, true
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// verifyFresh checks what a fresh design's requests left behind, for the
// users us who made answered requests between before and now: exactly one
// ride, one charge (in the database and at the payment API) and one outbox
// row per request, every key finished, and no unfinished key anywhere.
func (b *bench) verifyFresh(ctx context.Context, d *design, us []*user, answered int64, before dbSnapshot) error {
	ids := make([]int64, len(us))
	emails := make([]string, len(us))
	customers := map[string]bool{}
	for i, u := range us {
		ids[i], emails[i] = u.id, u.email
		customers[u.customer] = true
	}
	var errs []error
	check := func(what string, got, want int64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s: %d, want %d", what, got, want))
		}
	}

	var rides, distinctRides, charged, distinctCharged int64
	var rideCharges []string
	if err := b.admin.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT (user_id, idempotency_key)), count(stripe_charge_id),
		       count(DISTINCT stripe_charge_id),
		       coalesce(array_agg(stripe_charge_id) FILTER (WHERE stripe_charge_id IS NOT NULL), '{}')
		FROM rides WHERE user_id = ANY($1)`, ids).
		Scan(&rides, &distinctRides, &charged, &distinctCharged, &rideCharges); err != nil {
		return err
	}
	check("rides", rides, answered)
	check("keys with a ride", distinctRides, answered)
	check("rides with a charge", charged, answered)
	check("distinct charges on rides", distinctCharged, answered)

	var outbox, outboxRides int64
	if err := b.admin.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT o.ride_id) FROM outbox o JOIN rides r ON r.id = o.ride_id
		WHERE r.user_id = ANY($1)`, ids).Scan(&outbox, &outboxRides); err != nil {
		return err
	}
	check("outbox rows", outbox, answered)
	check("rides with an outbox row", outboxRides, answered)

	table := "idempotency_keys"
	if d.code == "a" {
		table = "hw_idempotency_keys"
	}
	var keys, finished int64
	if err := b.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE response_status = 201)
		FROM `+table+` WHERE scope = ANY($1)`, emails).Scan(&keys, &finished); err != nil {
		return err
	}
	check("keys recorded", keys, answered)
	check("keys finished with 201", finished, answered)
	if err := b.noUnfinished(ctx); err != nil {
		errs = append(errs, err)
	}

	// The payment API: only this cell ran since before.
	all := b.fake.Charges()
	made := all[min(before.charges, len(all)):]
	ids2 := map[string]bool{}
	downstreamKeys := map[string]bool{}
	for _, ch := range made {
		if !customers[ch.Customer] {
			errs = append(errs, fmt.Errorf("charge %s for customer %s, not a client of this measurement", ch.ID, ch.Customer))
			break
		}
		ids2[ch.ID] = true
		downstreamKeys[ch.IdempotencyKey] = true
	}
	check("charges at the payment API", int64(len(made)), answered)
	check("distinct charges at the payment API", int64(len(ids2)), answered)
	check("distinct idempotency keys at the payment API", int64(len(downstreamKeys)), answered)
	check("charge requests at the payment API", int64(b.fake.Requests()-before.requests), answered)
	for _, id := range rideCharges {
		if !ids2[id] {
			errs = append(errs, fmt.Errorf("ride charged %s, which the payment API did not make in this measurement", id))
			break
		}
	}
	return errors.Join(errs...)
}

// verifyReplay checks that replays changed nothing: no charge, no ride, no
// outbox row, no unfinished key.
func (b *bench) verifyReplay(ctx context.Context, before dbSnapshot) error {
	after, err := b.snapshotDB(ctx)
	if err != nil {
		return err
	}
	var errs []error
	if after.requests != before.requests || after.charges != before.charges {
		errs = append(errs, fmt.Errorf("the payment API got %d requests and made %d charges during replays",
			after.requests-before.requests, after.charges-before.charges))
	}
	if after.rides != before.rides || after.outbox != before.outbox {
		errs = append(errs, fmt.Errorf("replays added %d rides and %d outbox rows", after.rides-before.rides, after.outbox-before.outbox))
	}
	if err := b.noUnfinished(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// noUnfinished checks that no key, of either design, is unfinished.
func (b *bench) noUnfinished(ctx context.Context) error {
	var ap, hw int64
	if err := b.admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL),
		(SELECT count(*) FROM hw_idempotency_keys WHERE response_status IS NULL)`).Scan(&ap, &hw); err != nil {
		return err
	}
	if ap != 0 || hw != 0 {
		return fmt.Errorf("unfinished keys: %d atomicphase, %d hand-written", ap, hw)
	}
	return nil
}
