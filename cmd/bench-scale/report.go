package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

// runAtomicphase answers a new key through runner.
func runAtomicphase(ctx context.Context, runner *atomicphase.Runner, wf *atomicphase.Workflow[rideState], scope, key string, body []byte) error {
	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/rides", Params: body})
	if err != nil {
		return err
	}
	if resp.Status != http.StatusCreated || resp.Replayed {
		return fmt.Errorf("key %s/%s: status %d, replayed %v, want a fresh 201", scope, key, resp.Status, resp.Replayed)
	}
	return nil
}

// verify checks what a measurement's answered requests (keys beginning
// with prefix) left behind, through the coordinator: one ride, charged
// once, and one outbox row per request; every key recorded and finished;
// the payment API charged once per request; no two-phase commit.
func verify(ctx context.Context, c *cluster, design, prefix string, answered int64, charges0, requests0 int, twoPhase0 int64, fake *fakestripe.Server) error {
	var errs []error
	check := func(what string, got, want int64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s: %d, want %d", what, got, want))
		}
	}
	like := prefix + "-%"
	var rides, distinct, charged, distinctCharges, outbox int64
	if err := c.admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT (rider, idempotency_key)), count(stripe_charge_id),
		count(DISTINCT stripe_charge_id) FROM rides WHERE idempotency_key LIKE $1`, like).
		Scan(&rides, &distinct, &charged, &distinctCharges); err != nil {
		return err
	}
	if err := c.admin.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE idempotency_key LIKE $1`, like).Scan(&outbox); err != nil {
		return err
	}
	check("rides", rides, answered)
	check("keys with a ride", distinct, answered)
	check("rides with a charge", charged, answered)
	check("distinct charges on rides", distinctCharges, answered)
	check("outbox rows", outbox, answered)

	table := "idempotency_keys"
	if design != "atomicphase" {
		table = "hw_idempotency_keys"
	}
	var keys, finished, unfinished int64
	if err := c.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE idempotency_key LIKE $1),
		count(*) FILTER (WHERE idempotency_key LIKE $1 AND response_status = 201),
		count(*) FILTER (WHERE response_status IS NULL) FROM `+table, like).Scan(&keys, &finished, &unfinished); err != nil {
		return err
	}
	check("keys recorded", keys, answered)
	check("keys finished with 201", finished, answered)
	check("unfinished keys", unfinished, 0)

	made := fake.Charges()[charges0:]
	ids := map[string]bool{}
	for _, ch := range made {
		ids[ch.ID] = true
	}
	check("charges at the payment API", int64(len(made)), answered)
	check("distinct charges at the payment API", int64(len(ids)), answered)
	check("charge requests at the payment API", int64(fake.Requests()-requests0), answered)

	twoPhase, err := c.twoPhaseCommits(ctx)
	if err != nil {
		return err
	}
	check("two-phase commits", twoPhase-twoPhase0, 0)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", errVerify, err)
	}
	return nil
}

// report prints the tables: per configuration and entry mode,
// atomicphase's throughput, p99, throughput per database core and scaling
// from one worker; then atomicphase next to the hand-written design.
func report(out io.Writer, o *options, cells map[key]*cell, dbCores map[int]int) {
	type row struct {
		name    string
		workers int
		mode    string
	}
	var rows []row
	for _, w := range o.workers {
		if w == 0 {
			rows = append(rows, row{configName(0, ""), 0, "direct"})
			continue
		}
		for _, m := range o.modes {
			rows = append(rows, row{configName(w, m), w, m})
		}
	}
	rate := func(w int, m, d string) float64 {
		if c := cells[key{w, m, d}]; c != nil {
			return median(c.rate)
		}
		return 0
	}
	perCore := func(r float64, w int) string {
		if dbCores[w] == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", r/float64(dbCores[w]))
	}
	vsOne := func(w int, m, d string) string {
		one := rate(1, m, d)
		if w == 0 || one == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", rate(w, m, d)/one)
	}
	cores := func(w int) string {
		if dbCores[w] == 0 {
			return "unpinned"
		}
		return fmt.Sprint(dbCores[w])
	}

	fmt.Fprintf(out, "\natomicphase, %d clients (medians over %d round(s))\n", o.clients, o.rounds)
	fmt.Fprintf(out, "| configuration | DB cores | req/s | p50 ms | p99 ms | req/s per DB core | vs 1 worker |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		c := cells[key{r.workers, r.mode, "atomicphase"}]
		if c == nil {
			continue
		}
		fmt.Fprintf(out, "| %s | %s | %.0f | %s | %s | %s | %s |\n", r.name, cores(r.workers), median(c.rate),
			strings.TrimSuffix(ms(median(c.p50)), "ms"), strings.TrimSuffix(ms(median(c.p99)), "ms"),
			perCore(median(c.rate), r.workers), vsOne(r.workers, r.mode, "atomicphase"))
	}

	fmt.Fprintf(out, "\natomicphase next to the minimal hand-written design, same servers\n")
	fmt.Fprintf(out, "| configuration | atomicphase req/s | hand-written req/s | hand-written p99 ms | atomicphase / hand-written | hand-written vs 1 worker |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ap, hw := cells[key{r.workers, r.mode, "atomicphase"}], cells[key{r.workers, r.mode, "hand-written"}]
		if ap == nil || hw == nil {
			continue
		}
		ratios := make([]float64, len(ap.rate))
		for i := range ratios {
			ratios[i] = ap.rate[i] / hw.rate[i]
		}
		fmt.Fprintf(out, "| %s | %.0f | %.0f | %s | **%.2f** | %s |\n", r.name, median(ap.rate), median(hw.rate),
			strings.TrimSuffix(ms(median(hw.p99)), "ms"), median(ratios), vsOne(r.workers, r.mode, "hand-written"))
	}
}
