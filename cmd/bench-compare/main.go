// Command bench-compare measures what atomicphase costs next to the best
// hand-written pgx code for the same request, on a PostgreSQL with
// production durability (fsync and synchronous_commit on):
//
//	go run ./cmd/bench-compare            (make bench-compare)
//
// The request is Rocket-Rides-shaped: record the idempotency key, insert a
// ride, charge the rider at a payment API (an in-process fake, over HTTP on
// loopback, with an idempotency key), record the charge on the ride, insert
// an outbox row and store the response. Five designs answer it:
//
//	(a)  hand-written pgx: one statement records the key and inserts the
//	     ride, the call, then one pipelined transaction (a batch, BEGIN …
//	     COMMIT) records the charge, the outbox row and the response;
//	(b)  atomicphase: a local phase create_ride, a foreign phase charge
//	     whose record step writes the rest and responds, through Runner.Run,
//	     for new keys, not marked as retries: the key's read heads
//	     create_ride's batch, ahead of its recording, and a new key costs
//	     two round trips, as (a) does;
//	(c)  replays of finished keys through Runner.Run, not marked as
//	     retries (Request.Retry false): one round trip, the batch headed
//	     by the key's read, which finds the key finished; the start
//	     function and create_ride ran to build it, and nothing they queued
//	     reaches the database;
//	(c') the same replays marked as retries (Request.Retry true): the key
//	     is read first, in a round trip of its own, and no phase runs;
//	(d)  a primary-key SELECT of a key row's response: the floor of (c)
//	     and (c').
//
// With -read-first, (a) reads its key before it records it, in a round
// trip of its own, as hand-written code must that answers a retry of a
// finished request without running any of its work, as (c') does. (a)
// then costs three round trips, one more than (b): what a new key marked
// as a retry costs atomicphase.
//
// With -rtt D, every design's pool connects to PostgreSQL through an
// in-process TCP proxy that adds D to every round trip: it holds each
// chunk of bytes D/2 on its way to the server and D/2 on its way back
// (with D 0, the default, there is no proxy). It adds latency, not a limit
// on throughput; the connections that set up the database and check it
// after each measurement bypass it. Its CPU time and allocations are this
// process's: they count in the client columns. The report gives the mean
// time it held a chunk: D/2 and the time the machine takes to wake a
// sleeping thread, more on a busy machine.
//
// Every design runs at each concurrency in every round, interleaved, for a
// fixed duration; after each measurement the database and the payment API
// are checked (one ride, one charge and one outbox row per answered request,
// no unfinished key; after a replay design, nothing new), and any mismatch
// fails the command. docs/performance.md explains the table it prints.
//
// It starts its own PostgreSQL (internal/pgtemp, durable settings) unless
// DATABASE_URL is set, in which case it measures there with that server's
// settings, in a database it creates and drops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// options are the command's flags (parseFlags).
type options struct {
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	clients     []int
	replayKeys  int
	cpuprofile  string
	memprofile  string
	pgss        bool
	readFirst   bool
	rtt         time.Duration
	diagClients int
	serverCores string
}

// parseFlags parses the command's arguments; errOut takes the usage text
// and flag's own messages. An invalid value is an error, never a default.
func parseFlags(args []string, errOut io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench-compare", flag.ContinueOnError)
	fs.SetOutput(errOut)
	o := &options{}
	clients := fs.String("clients", "1,8,32", "the `list` of concurrent client counts to measure, comma-separated")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "how long each measurement runs (one design at one concurrency in one round)")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "how long each design runs at each concurrency before the rounds, unmeasured")
	fs.IntVar(&o.rounds, "rounds", 5, "how many rounds; each runs every design at every concurrency")
	fs.IntVar(&o.replayKeys, "replay-keys", 2000, "how many finished keys the replay designs read")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "after the rounds, run each design at -diag-clients clients once more and write this process's CPU profile of atomicphase (b) to `FILE`, and of (a), (c), (c') and (d) to FILE with -handwritten, -replay, -replay-marked and -pkselect before its extension")
	fs.StringVar(&o.memprofile, "memprofile", "", "like -cpuprofile, for the heap allocations of each design's extra run (go tool pprof -sample_index=alloc_objects FILE)")
	fs.BoolVar(&o.pgss, "pgss", false, "enable pg_stat_statements and, after the rounds, print each design's top statements by total time at -diag-clients clients")
	fs.BoolVar(&o.readFirst, "read-first", false, "run (a) with a read of its key before it records it (a round trip of its own, as a request marked as a retry has), as hand-written code that answers a replay without running any of its work must")
	fs.DurationVar(&o.rtt, "rtt", 0, "add `D` to every round trip between the designs' pools and PostgreSQL, through an in-process TCP proxy that holds each chunk of bytes D/2 each way (0: no proxy)")
	fs.IntVar(&o.diagClients, "diag-clients", 8, "the concurrency of the -cpuprofile and -pgss runs")
	fs.StringVar(&o.serverCores, "server-cores", "", "run the server bench-compare starts on these CPUs (taskset's `list`, e.g. 0-7), and pin this command elsewhere yourself (taskset -c 8-15 bench-compare …)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, f := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-clients: %q is not a positive number", f)
		}
		o.clients = append(o.clients, n)
	}
	switch {
	case o.rounds < 1:
		return nil, errors.New("-rounds must be at least 1")
	case o.duration <= 0:
		return nil, errors.New("-duration must be positive")
	case o.replayKeys < 1:
		return nil, errors.New("-replay-keys must be at least 1")
	case o.diagClients < 1:
		return nil, errors.New("-diag-clients must be at least 1")
	case o.rtt < 0:
		return nil, errors.New("-rtt must not be negative")
	}
	return o, nil
}

// main parses the flags, runs the measurements until done or
// interrupted, and exits 2 for bad flags, 1 for a failed run.
func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, opts, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "\nbench-compare: FAILED:", err)
		os.Exit(1)
	}
}

// run measures as o says and writes the report to out.
func run(ctx context.Context, o *options, out io.Writer) error {
	began := time.Now()
	maxClients := slices.Max(append(slices.Clone(o.clients), o.diagClients))
	fmt.Fprintf(out, "bench-compare: atomicphase next to hand-written pgx, one Rocket-Rides-shaped request\n")
	fmt.Fprintf(out, "machine: %d CPUs (%s), GOMAXPROCS %d, %s %s/%s, load average %s; clients, the fake payment API and PostgreSQL share the CPUs\n",
		runtime.NumCPU(), cpuModel(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadAverage())

	url, serverCPU, stopServer, err := openServer(ctx, out, 5*maxClients+8, o.pgss, o.serverCores)
	if err != nil {
		return err
	}
	defer stopServer()
	db, err := createDatabase(ctx, url, o.pgss)
	if err != nil {
		return err
	}
	defer db.drop()
	info, err := readServerInfo(ctx, db.admin)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "PostgreSQL: %s\nsettings: %s\n", info.version, strings.Join(info.settings, " "))

	fake, err := fakestripe.Start()
	if err != nil {
		return err
	}
	defer fake.Close()
	fmt.Fprintf(out, "payment API: fakestripe at %s, in this process\n", fake.URL)

	b, err := newBench(ctx, db.config, db.admin, fake, maxClients, designOpts{readFirst: o.readFirst, rtt: o.rtt})
	if err != nil {
		return err
	}
	defer b.close()
	if b.proxy != nil {
		fmt.Fprintf(out, "network: -rtt %s: every design's pool connects through an in-process proxy at %s that holds each chunk %s on its way to the server and %s on its way back; set-up and checks connect directly\n",
			o.rtt, b.proxy.addr(), b.proxy.toServer, b.proxy.toClient)
	} else {
		fmt.Fprintf(out, "network: -rtt 0: every design's pool connects to the server directly\n")
	}
	b.serverCPU = serverCPU
	t0 := time.Now()
	if err := b.createFinished(ctx, o.replayKeys); err != nil {
		return fmt.Errorf("create the keys to replay: %w", err)
	}
	fmt.Fprintf(out, "replay pool: %d keys finished through atomicphase in %s, verified\n", o.replayKeys, time.Since(t0).Round(time.Millisecond))
	fmt.Fprintf(out, "plan: %d rounds × clients %s × %d designs × %s, interleaved (each ratio's two designs back to back, the order changing each round), after a %s warm-up of each\n",
		o.rounds, joinInts(o.clients), len(b.designs), o.duration, o.warmup)

	for _, n := range o.clients {
		for _, d := range b.designs {
			if _, err := b.measure(ctx, d, fmt.Sprintf("w-c%d", n), n, o.warmup, nil); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	// Start the measurements from a clean slate: the warm-up's and the
	// replay pool's writes on disk, and no checkpoint due for
	// checkpoint_timeout.
	if _, err := db.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(out, "note: CHECKPOINT refused (%v); measuring without it\n", err)
	}
	fmt.Fprintf(out, "warm-up done and verified; measuring\n\n")

	rs := newResults(o.rounds)
	cells := 0
	for r := 1; r <= o.rounds; r++ {
		for _, n := range o.clients {
			order := roundOrder(b.designs, r)
			var line []string
			var others []float64
			for _, d := range order {
				res, err := b.measure(ctx, d, fmt.Sprintf("r%d-c%d", r, n), n, o.duration, nil)
				if err != nil {
					return err
				}
				rs.add(res)
				cells++
				line = append(line, fmt.Sprintf("(%s) %.0f/s", d.code, res.perSecond()))
				others = append(others, res.others)
			}
			fmt.Fprintf(out, "round %d/%d, %-10s %s  verified, %s\n", r, o.rounds, clientsLabel(n)+":", strings.Join(line, "  "), othersLabel(others))
		}
	}
	fmt.Fprintf(out, "\nall %d measurements verified: one ride, one charge (database and payment API) and one outbox row per answered request; no unfinished key\n", cells)
	rs.print(out, o.clients, b.designs)
	if b.proxy != nil {
		held, n := b.proxy.meanHeld()
		fmt.Fprintf(out, "\nproxy (-rtt %s), whole run: held %d chunks a mean of %s each (asked %s each way): about %s added per round trip\n",
			o.rtt, n, held.Round(time.Microsecond), b.proxy.toServer, (2 * held).Round(time.Microsecond))
	}
	if err := printHOT(ctx, out, b); err != nil {
		return err
	}

	if o.cpuprofile != "" || o.memprofile != "" || o.pgss {
		if err := diagnose(ctx, out, b, o); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\ntotal time %s, load average %s\n", time.Since(began).Round(time.Second), loadAverage())
	return nil
}

// diagnose runs each design once more at o.diagClients clients, with a CPU
// profile of each and/or pg_stat_statements' top statements.
func diagnose(ctx context.Context, out io.Writer, b *bench, o *options) error {
	n := o.diagClients
	fmt.Fprintf(out, "\ndiagnostics: each design once more at %d clients for %s (not in the tables above)\n", n, o.duration)
	for _, d := range b.designs {
		h := &hooks{}
		var profile *os.File
		var walStart string
		file := ""
		if o.cpuprofile != "" {
			file = profileFile(o.cpuprofile, d.code)
		}
		memFile := ""
		if o.memprofile != "" {
			memFile = profileFile(o.memprofile, d.code)
		}
		h.before = func() error {
			if o.pgss {
				if _, err := b.admin.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
					return fmt.Errorf("-pgss: %w", err)
				}
				if err := b.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walStart); err != nil {
					return fmt.Errorf("-pgss: %w", err)
				}
			}
			if memFile != "" {
				// Every allocation sampled, from here: the profile's
				// alloc_objects are this run's allocations.
				runtime.MemProfileRate = 1
				runtime.GC()
				if err := writeHeapProfile(memFile + ".before"); err != nil {
					return err
				}
			}
			if file != "" {
				f, err := os.Create(file)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					f.Close()
					return err
				}
				profile = f
			}
			return nil
		}
		h.after = func(res *cellResult) error {
			if profile != nil {
				pprof.StopCPUProfile()
				if err := profile.Close(); err != nil {
					return err
				}
			}
			fmt.Fprintf(out, "\n(%s) %s: %.0f req/s, %.2f round trips and %.2f commits per request\n",
				d.code, d.name, res.perSecond(), float64(res.counts.trips)/float64(res.requests), float64(res.counts.commits)/float64(res.requests))
			if memFile != "" {
				runtime.GC()
				err := writeHeapProfile(memFile)
				runtime.MemProfileRate = 512 * 1024
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "  allocations: go tool pprof -sample_index=alloc_objects -base %s.before -top %s\n", memFile, memFile)
			}
			if file != "" {
				fmt.Fprintf(out, "  CPU profile: %s (go tool pprof -top %s)\n", file, file)
			}
			if o.pgss {
				if err := pgssTop(ctx, out, b.admin, res, 8); err != nil {
					return err
				}
				return walTop(ctx, out, b.admin, walStart, res, 8)
			}
			return nil
		}
		if _, err := b.measure(ctx, d, fmt.Sprintf("x-c%d", n), n, o.duration, h); err != nil {
			if profile != nil {
				pprof.StopCPUProfile()
				profile.Close()
			}
			return err
		}
	}
	return nil
}

// writeHeapProfile writes the heap profile (allocations since the
// program started, sampled at runtime.MemProfileRate) to file.
func writeHeapProfile(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// roundOrder is the order the designs (a, b, c, c', d, as newBench
// gives them) run in, in round r (from 1): each ratio's two designs, (a)
// with (b), (c) with (d) and (c') with (d), run next to each other, (d)
// between the replays, so that a change in the machine's load between
// them is short; which group goes first and the order within each group
// change from round to round.
func roundOrder(d []*design, r int) []*design {
	a, b, c, cm, dd := d[0], d[1], d[2], d[3], d[4]
	orders := [][]*design{{a, b, c, dd, cm}, {cm, dd, c, b, a}, {b, a, cm, dd, c}, {c, dd, cm, a, b}}
	return orders[(r-1)%len(orders)]
}

// othersLabel says how much of the machine's CPU time other work took
// during measurements (each cell's share; -1 when unknown).
func othersLabel(shares []float64) string {
	var parts []string
	for _, x := range shares {
		if x < 0 {
			return "other work unknown"
		}
		parts = append(parts, fmt.Sprintf("%.0f", 100*x))
	}
	return "other work " + strings.Join(parts, "/") + "% of the CPUs"
}

// loadAverage is the machine's load average over the last minute, from
// /proc/loadavg: other work sharing the CPUs shows there.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// profileFile names the CPU profile of design code: name itself for
// atomicphase (b), name with -handwritten, -replay, -replay-marked or
// -pkselect before its extension for the others.
func profileFile(name, code string) string {
	suffix := map[string]string{"a": "-handwritten", "c": "-replay", "c'": "-replay-marked", "d": "-pkselect"}[code]
	ext := filepath.Ext(name)
	return strings.TrimSuffix(name, ext) + suffix + ext
}

// clientsLabel is "1 client" or "N clients".
func clientsLabel(n int) string {
	if n == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", n)
}

// joinInts writes xs comma-separated.
func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
