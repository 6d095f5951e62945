// Command bench-scale measures how atomicphase scales out on Citus, next
// to the minimal hand-written pgx design on the same servers:
//
//	go run ./cmd/bench-scale                      (make bench-scale)
//	go run ./cmd/bench-scale -workers 0,1,2,4 -node-cores 2 -clients 128
//
// For each configuration (-workers: 0 is one plain PostgreSQL; N is a Citus
// coordinator and N workers) it starts fresh durable servers (fsync,
// synchronous_commit and full_page_writes on), each pinned to -node-cores
// CPUs of its own when asked, distributes the key table and the workload's
// tables by the rider (the request's scope, the tenant), and runs both
// designs through each entry mode (-modes):
//
//	coordinator  every request through the coordinator
//	any          client i through worker i mod N (any worker serves any tenant)
//	tenant       each request through the worker holding its rider's shard
//	             (apcitus.Router for atomicphase; the same pool for the
//	             hand-written design)
//
// The request is Rocket-Rides-shaped: a local phase inserts the ride with
// the key, a foreign phase charges at a payment API (an in-process fake
// over loopback HTTP) and records the charge, an outbox row and the
// response. The hand-written design records the key and the ride in one
// pipelined transaction, charges, and writes the rest in a second.
//
// Every measurement is verified: one ride, one charge (in the database and
// at the payment API) and one outbox row per answered request, every key
// finished, and no two-phase commit on any node. Any mismatch fails the
// command. -pgss prints each node's top statements per request; -diagnose
// samples each node's wait events during each measurement and prints them
// with the latency's tail, where the requests' time went (the slowest 1%
// apart) and the Runner's log records (retries, takeovers). It prints each configuration's throughput, p99 and throughput
// per database core, the scaling from one worker, and atomicphase's ratio
// to the hand-written design. docs/scale.md explains the tables.
//
// It needs PostgreSQL binaries with Citus installed in them (as the test
// harness finds them: ATOMICPHASE_TEST_PG_BIN, or /usr/lib/postgresql/*/bin),
// and taskset to pin. Pin the command itself to the cores the nodes leave
// free: taskset -c 10-15 bench-scale -node-cores 2 (four workers and a
// coordinator on cores 0-9).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/internal/benchkit"
)

type options struct {
	workers   []int
	modes     []string
	clients   int
	tenants   int
	shards    int
	duration  time.Duration
	warmup    time.Duration
	rounds    int
	nodeCores int
	firstCore int
	pgss      bool
	diagnose  bool
	out       io.Writer // where -pgss prints
}

func parseFlags(args []string, errOut io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench-scale", flag.ContinueOnError)
	fs.SetOutput(errOut)
	o := &options{}
	workers := fs.String("workers", "0,1,2", "the `list` of configurations: 0 is one plain PostgreSQL, N a Citus coordinator and N workers")
	modes := fs.String("modes", "coordinator,any,tenant", "the entry `modes` to measure on Citus: coordinator, any, tenant")
	fs.IntVar(&o.clients, "clients", 32, "concurrent clients")
	fs.IntVar(&o.tenants, "tenants", 10000, "riders (tenants); each request picks one at random")
	fs.IntVar(&o.shards, "shards", 32, "shards of each distributed table")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long each measurement runs")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "how long each design runs in each mode before its measurements, unmeasured")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds; each runs both designs in every mode, the order alternating")
	fs.IntVar(&o.nodeCores, "node-cores", 0, "pin each server to this many CPUs of its own, from -first-core (0: no pinning)")
	fs.IntVar(&o.firstCore, "first-core", 0, "the first CPU of the coordinator (or the plain server)")
	fs.BoolVar(&o.pgss, "pgss", false, "load pg_stat_statements on every node (tracking statements inside functions too) and print each node's top statements after each measurement")
	fs.BoolVar(&o.diagnose, "diagnose", false, "during each measurement, sample every node's wait events and time each request's stretches (to its first commit, the payment call, its last commit: atomicphase's Runner then has an Observer); after it, print them, the latency's tail and the Runner's log records (retries, takeovers, lost locks)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-workers: %q is not a number of workers", f)
		}
		o.workers = append(o.workers, n)
	}
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m != "coordinator" && m != "any" && m != "tenant" {
			return nil, fmt.Errorf("-modes: %q is not coordinator, any or tenant", m)
		}
		o.modes = append(o.modes, m)
	}
	switch {
	case o.clients < 1, o.tenants < 1, o.shards < 1, o.rounds < 1:
		return nil, errors.New("-clients, -tenants, -shards and -rounds must be at least 1")
	case o.duration <= 0 || o.warmup < 0:
		return nil, errors.New("-duration must be positive and -warmup not negative")
	case o.nodeCores < 0 || o.firstCore < 0:
		return nil, errors.New("-node-cores and -first-core must not be negative")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(2)
	}
	// SIGINT and SIGTERM end the run: every request and statement under
	// ctx stops, and each configuration's servers are stopped and their
	// data directories removed on the way out.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, o, os.Stdout)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		fmt.Fprintln(os.Stderr, "\nbench-scale: interrupted: stopped the servers it started; no result")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "\nbench-scale: FAILED:", err)
		os.Exit(1)
	}
}

// cell is one design's measurements in one mode of one configuration.
type cell struct {
	rate []float64       // req/s by round
	p99  []time.Duration // by round
	p50  []time.Duration
}

type key struct {
	workers int
	mode    string
	design  string
}

func run(ctx context.Context, o *options, out io.Writer) error {
	began := time.Now()
	o.out = out
	fake, err := fakestripe.Start()
	if err != nil {
		return err
	}
	defer fake.Close()
	pay := benchkit.NewPayments(fake.URL, 1024)
	rs := riders(o.tenants)
	byEmail := map[string]*rider{}
	for i := range rs {
		byEmail[rs[i].email] = &rs[i]
	}
	wf := rideWorkflow(byEmail, pay)

	fmt.Fprintf(out, "bench-scale: atomicphase and hand-written pgx on PostgreSQL and Citus\n")
	fmt.Fprintf(out, "machine: %d CPUs, GOMAXPROCS %d, %s %s/%s; %d clients, %d tenants, %d shards, %s per measurement, %d round(s)\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, o.clients, o.tenants, o.shards, o.duration, o.rounds)
	if o.nodeCores == 0 {
		fmt.Fprintln(out, "pinning: none (-node-cores 0): the servers and the clients share every CPU")
	}

	cells := map[key]*cell{}
	var dbCores = map[int]int{}
	seq := 0
	for _, workers := range o.workers {
		c, err := startCluster(ctx, o, workers)
		if err != nil {
			return fmt.Errorf("%s: %w", configName(workers, ""), err)
		}
		dbCores[workers] = c.dbCores(o)
		if err := createRiders(ctx, c.admin, rs); err != nil {
			c.stop()
			return err
		}
		pinned := ""
		if o.nodeCores > 0 {
			pinned = ", CPUs " + strings.Join(c.cores, " ")
		}
		fmt.Fprintf(out, "\n%s: %d server(s)%s\n", configName(workers, ""), len(c.nodes), pinned)
		modes := o.modes
		if workers == 0 {
			modes = []string{"direct"}
		}
		err = func() error {
			defer c.stop()
			entries := map[string]*entry{}
			defer func() {
				for _, e := range entries {
					e.close()
				}
			}()
			for _, mode := range modes {
				e, err := newEntry(ctx, c, mode, o.clients, wf, o.diagnose)
				if err != nil {
					return fmt.Errorf("%s: %w", configName(workers, mode), err)
				}
				entries[mode] = e
				for _, design := range []string{"atomicphase", "hand-written"} {
					seq++
					if _, err := measure(ctx, o, c, e, design, rs, pay, fake, fmt.Sprintf("w%d", seq), o.warmup); err != nil {
						return fmt.Errorf("%s, %s, warm-up: %w", configName(workers, mode), design, err)
					}
				}
			}
			for round := range o.rounds {
				for _, mode := range modes {
					designs := []string{"atomicphase", "hand-written"}
					if round%2 == 1 {
						slices.Reverse(designs)
					}
					var line []string
					for _, design := range designs {
						seq++
						res, err := measure(ctx, o, c, entries[mode], design, rs, pay, fake, fmt.Sprintf("m%d", seq), o.duration)
						if err != nil {
							return fmt.Errorf("%s, %s: %w", configName(workers, mode), design, err)
						}
						k := key{workers, mode, design}
						if cells[k] == nil {
							cells[k] = &cell{}
						}
						cells[k].rate = append(cells[k].rate, res.rate)
						cells[k].p50 = append(cells[k].p50, res.p50)
						cells[k].p99 = append(cells[k].p99, res.p99)
						line = append(line, fmt.Sprintf("%s %.0f/s p99 %s", design, res.rate, ms(res.p99)))
					}
					fmt.Fprintf(out, "  round %d, %-11s %s; verified\n", round+1, mode+":", strings.Join(line, ", "))
				}
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	report(out, o, cells, dbCores)
	fmt.Fprintf(out, "\nevery measurement verified: one ride, one charge (database and payment API) and one outbox row per answered request; every key finished; no two-phase commit\ntotal time %s\n", time.Since(began).Round(time.Second))
	return nil
}

func configName(workers int, mode string) string {
	if workers == 0 {
		return "plain PostgreSQL"
	}
	s := "Citus, " + strconv.Itoa(workers) + " worker"
	if workers > 1 {
		s += "s"
	}
	switch mode {
	case "coordinator":
		s += ", → coordinator"
	case "any":
		s += ", → any worker"
	case "tenant":
		s += ", → tenant's worker"
	}
	return s
}

// result is one measurement.
type result struct {
	rate     float64
	p50, p99 time.Duration
}

// measure runs design through e with o.clients clients for d, then
// verifies what the answered requests left behind (their keys begin with
// prefix).
func measure(ctx context.Context, o *options, c *cluster, e *entry, design string, rs []rider, pay *benchkit.Payments, fake *fakestripe.Server, prefix string, d time.Duration) (result, error) {
	charges0, requests0 := len(fake.Charges()), fake.Requests()
	twoPhase0, err := c.twoPhaseCommits(ctx)
	if err != nil {
		return result{}, err
	}
	if o.pgss {
		if err := c.resetStatements(ctx); err != nil {
			return result{}, err
		}
	}
	var waits *sampler
	if o.diagnose && d == o.duration {
		if waits, err = startSampler(ctx, c); err != nil {
			return result{}, err
		}
		defer waits.stop()
	}
	runnerLog.take() // what the warm-up or the other design logged
	var answered atomic.Int64
	lats := make([][]time.Duration, o.clients)
	var tls [][]*timeline
	if waits != nil {
		tls = make([][]*timeline, o.clients)
	}
	errs := make([]error, o.clients)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for client := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(client), uint64(len(prefix))))
			runner := e.runner(client)
			for n := 0; time.Now().Before(deadline) && rctx.Err() == nil; n++ {
				r := &rs[rng.IntN(len(rs))]
				k := prefix + "-" + strconv.Itoa(client) + "-" + strconv.Itoa(n)
				body := rideBody(n)
				t0 := time.Now()
				qctx := rctx
				var tl *timeline
				if tls != nil {
					tl = &timeline{start: t0}
					qctx = withTimeline(rctx, tl)
				}
				var err error
				if design == "atomicphase" {
					err = runAtomicphase(qctx, runner, e.wf, r.email, k, body)
				} else {
					err = handWritten(qctx, e.pool(client, r.email), pay, r, k, body)
				}
				if err != nil {
					errs[client] = err
					cancel()
					return
				}
				lats[client] = append(lats[client], time.Since(t0))
				if tl != nil {
					tl.end = time.Now()
					tls[client] = append(tls[client], tl)
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		// Interrupted: the clients stopped, perhaps before any answer.
		return result{}, err
	}
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	n := answered.Load()
	if n == 0 {
		return result{}, errors.New("no request was answered")
	}
	if waits != nil {
		fmt.Fprintf(o.out, "    %s, %s: p50 %s, p90 %s, p99 %s, p99.9 %s, max %s\n", e.name, design,
			ms(benchkit.Percentile(all, 0.50)), ms(benchkit.Percentile(all, 0.90)), ms(benchkit.Percentile(all, 0.99)),
			ms(benchkit.Percentile(all, 0.999)), ms(all[len(all)-1]))
		printTimelines(o.out, slices.Concat(tls...))
		waits.print(o.out, c.nodeNames())
		if lines := runnerLog.take(); len(lines) > 0 {
			fmt.Fprintf(o.out, "    the Runner's log records:\n      %s\n", strings.Join(lines, "\n      "))
		}
	}
	if o.pgss && d == o.duration {
		if err := c.printStatements(ctx, o.out, fmt.Sprintf("%s, %s", e.name, design), n); err != nil {
			return result{}, err
		}
	}
	if err := verify(ctx, c, design, prefix, n, charges0, requests0, twoPhase0, fake); err != nil {
		return result{}, err
	}
	return result{rate: float64(n) / elapsed.Seconds(), p50: benchkit.Percentile(all, 0.50), p99: benchkit.Percentile(all, 0.99)}, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

func median[T int64 | float64 | time.Duration](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
