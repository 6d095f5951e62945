package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// results holds the measurements, by clients and design, one per round.
type results struct {
	rounds int
	cells  map[int]map[string][]*cellResult
}

// newResults holds the measurements of the given number of rounds.
func newResults(rounds int) *results {
	return &results{rounds: rounds, cells: map[int]map[string][]*cellResult{}}
}

// add records a measurement, after its design's at the same concurrency
// in earlier rounds.
func (rs *results) add(r *cellResult) {
	if rs.cells[r.clients] == nil {
		rs.cells[r.clients] = map[string][]*cellResult{}
	}
	rs.cells[r.clients][r.design] = append(rs.cells[r.clients][r.design], r)
}

// median is the median of xs, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianOf is the median of f over cells.
func medianOf(cells []*cellResult, f func(*cellResult) float64) float64 {
	xs := make([]float64, len(cells))
	for i, c := range cells {
		xs[i] = f(c)
	}
	return median(xs)
}

// perRequest sums a counter over the rounds and divides by the requests.
func perRequest(cells []*cellResult, f func(*cellResult) float64) float64 {
	var sum, n float64
	for _, c := range cells {
		sum += f(c)
		n += float64(c.requests)
	}
	return sum / n
}

// ms writes d, a time in nanoseconds, in milliseconds.
func ms(d float64) string { return fmt.Sprintf("%.2fms", d/float64(time.Millisecond)) }

// ratios returns, round by round, num's req/s over den's, and their median.
func (rs *results) ratios(clients int, num, den string) ([]float64, float64) {
	a, b := rs.cells[clients][num], rs.cells[clients][den]
	var out []float64
	for i := range min(len(a), len(b)) {
		out = append(out, a[i].perSecond()/b[i].perSecond())
	}
	return out, median(out)
}

// fmtRatios writes xs space-separated, two decimals each.
func fmtRatios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, " ")
}

// print writes a table per concurrency, then the ratios.
func (rs *results) print(out io.Writer, clients []int, designs []*design) {
	for _, n := range clients {
		fmt.Fprintf(out, "\n%s\n", clientsLabel(n))
		fmt.Fprintf(out, "%-24s %7s %9s %9s %12s %7s %9s %10s %11s %14s %14s\n",
			"design", "req/s", "p50", "p99", "commits/req", "RT/req", "xids/req", "WAL B/req", "allocs/req", "client µs/req", "server µs/req")
		for _, d := range designs {
			cells := rs.cells[n][d.code]
			if len(cells) == 0 {
				continue
			}
			server := "-"
			if cells[0].serverCPU >= 0 {
				server = fmt.Sprintf("%.0f", perRequest(cells, func(c *cellResult) float64 { return float64(c.serverCPU.Microseconds()) }))
			}
			fmt.Fprintf(out, "%-24s %7.0f %9s %9s %12.2f %7.2f %9.2f %10.0f %11.0f %14.0f %14s\n",
				"("+d.code+") "+d.name,
				medianOf(cells, (*cellResult).perSecond),
				ms(medianOf(cells, func(c *cellResult) float64 { return float64(c.p50) })),
				ms(medianOf(cells, func(c *cellResult) float64 { return float64(c.p99) })),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.counts.commits) }),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.counts.trips) }),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.xids) }),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.walBytes) }),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.mallocs) }),
				perRequest(cells, func(c *cellResult) float64 { return float64(c.cpu.Microseconds()) }),
				server)
		}
		var others []float64
		for _, d := range designs {
			for _, c := range rs.cells[n][d.code] {
				if c.others >= 0 {
					others = append(others, c.others)
				}
			}
		}
		if len(others) > 0 {
			fmt.Fprintf(out, "  other work on the machine during these measurements: median %.0f%%, at most %.0f%% of the CPUs\n",
				100*median(others), 100*slices.Max(others))
		}
		for _, r := range reportedRatios {
			if xs, m := rs.ratios(n, r.num, r.den); len(xs) > 0 {
				fmt.Fprintf(out, "  %-45s %s → median %.2f\n", r.label+" req/s, by round:", fmtRatios(xs), m)
			}
		}
	}
	fmt.Fprintf(out, "\nratios of req/s (median over rounds of the ratio within each round)\n")
	fmt.Fprintf(out, "%-8s", "clients")
	for _, r := range reportedRatios {
		fmt.Fprintf(out, " %*s", r.width(), r.column)
	}
	fmt.Fprintln(out)
	for _, n := range clients {
		fmt.Fprintf(out, "%-8d", n)
		for _, r := range reportedRatios {
			_, m := rs.ratios(n, r.num, r.den)
			fmt.Fprintf(out, " %*.2f", r.width(), m)
		}
		fmt.Fprintln(out)
	}
}

// ratio is a ratio of two designs' req/s that the report gives: num's
// over den's, by round under label, and in the summary under column.
type ratio struct {
	num, den, label, column string
}

// width is the summary column's width: room for its heading (ASCII) and
// two spaces before it, and at least 20.
func (r ratio) width() int { return max(20, len(r.column)+2) }

// reportedRatios are the ratios the report gives, in its order.
var reportedRatios = []ratio{
	{"b", "a", "atomicphase / hand-written", "atomicphase/hand-written"},
	{"c", "d", "replay / PK select", "replay/PK select"},
	{"c'", "d", "replay (marked) / PK select", "replay (marked)/PK select"},
}

// pgssTop prints the statements that took the most server time since the
// last reset, per request of res.
func pgssTop(ctx context.Context, out io.Writer, admin *pgxpool.Pool, res *cellResult, limit int) error {
	rows, err := admin.Query(ctx, `
		SELECT calls, total_exec_time, rows, wal_bytes::float8, regexp_replace(query, '\s+', ' ', 'g'),
		       sum(total_exec_time) OVER ()
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT ILIKE '%pg_stat_statements%'
		ORDER BY total_exec_time DESC`)
	if err != nil {
		return err
	}
	defer rows.Close()
	req := float64(res.requests)
	fmt.Fprintf(out, "  %9s %9s %9s %9s %6s  %s\n", "calls/req", "mean", "time/req", "WAL B/req", "share", "statement")
	shown := 0
	var total float64
	for rows.Next() {
		var calls, nrows int64
		var totalMS, wal float64
		var query string
		if err := rows.Scan(&calls, &totalMS, &nrows, &wal, &query, &total); err != nil {
			return err
		}
		if shown >= limit {
			continue
		}
		shown++
		if len(query) > 100 {
			query = query[:97] + "..."
		}
		fmt.Fprintf(out, "  %9.2f %7.3fms %7.3fms %9.0f %5.1f%%  %s\n",
			float64(calls)/req, totalMS/float64(calls), totalMS/req, wal/req, 100*totalMS/max(total, 1e-9), query)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "  server execution time, all statements: %.3fms per request\n", total/req)
	return nil
}

// walTop prints the WAL the server wrote since the position start, by
// record type, per request: what pg_walinspect's pg_get_wal_stats
// reports, largest first, with full-page images apart. It prints one line
// instead when the server has no pg_walinspect (before PostgreSQL 15).
func walTop(ctx context.Context, out io.Writer, admin *pgxpool.Pool, start string, res *cellResult, limit int) error {
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		fmt.Fprintf(out, "  WAL by record type: unavailable (pg_walinspect: %v)\n", err)
		return nil
	}
	var written int64
	if err := admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), $1::pg_lsn)::bigint`, start).Scan(&written); err != nil {
		return err
	}
	if written <= 0 {
		fmt.Fprintf(out, "  WAL: none written\n")
		return nil
	}
	rows, err := admin.Query(ctx, `
		SELECT "resource_manager/record_type", count, record_size, fpi_size
		FROM pg_get_wal_stats($1::pg_lsn, pg_current_wal_flush_lsn(), true)
		WHERE count > 0 ORDER BY combined_size DESC`, start)
	if err != nil {
		// pg_walinspect reads WAL files: superusers and pg_read_server_files only.
		fmt.Fprintf(out, "  WAL by record type: unavailable (%v)\n", err)
		return nil
	}
	defer rows.Close()
	req := float64(res.requests)
	fmt.Fprintf(out, "  %-26s %9s %12s %12s\n", "WAL record type", "recs/req", "record B/req", "FPI B/req")
	shown := 0
	var recTotal, fpiTotal float64
	for rows.Next() {
		var kind string
		var n, rec, fpi int64
		if err := rows.Scan(&kind, &n, &rec, &fpi); err != nil {
			return err
		}
		recTotal += float64(rec)
		fpiTotal += float64(fpi)
		if shown >= limit {
			continue
		}
		shown++
		fmt.Fprintf(out, "  %-26s %9.2f %12.0f %12.0f\n", kind, float64(n)/req, float64(rec)/req, float64(fpi)/req)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(out, "  WAL by record type: unavailable (%v)\n", err)
		return nil
	}
	fmt.Fprintf(out, "  WAL, all records: %.0f B of records and %.0f B of full-page images per request\n", recTotal/req, fpiTotal/req)
	return nil
}

// printHOT prints the share of each design's key-table updates that were
// HOT (heap-only: the new row version stays on its page and no index gets
// an entry), over the whole run, from pg_stat_user_tables. A finish that
// changes an indexed column, or no longer fits on its page, is not. The
// server publishes a backend's counts within a second or so of its
// transactions, so the last moments of the run may be missing.
func printHOT(ctx context.Context, out io.Writer, b *bench) error {
	fmt.Fprintf(out, "\nkey-table updates that were HOT, whole run (pg_stat_user_tables n_tup_hot_upd / n_tup_upd)\n")
	for _, t := range []struct{ design, table string }{
		{"(a) " + b.design("a").name, "hw_idempotency_keys"}, {"(b) " + b.design("b").name, "idempotency_keys"},
	} {
		var upd, hot int64
		var indexes int
		err := b.admin.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd,
			(SELECT count(*) FROM pg_index WHERE indrelid = relid)::int
			FROM pg_stat_user_tables WHERE relname = $1`, t.table).Scan(&upd, &hot, &indexes)
		if err != nil {
			return fmt.Errorf("the update counts of %s: %w", t.table, err)
		}
		share := 0.0
		if upd > 0 {
			share = 100 * float64(hot) / float64(upd)
		}
		fmt.Fprintf(out, "%-24s %5.1f%% of %d updates (%s, %d indexes)\n", t.design, share, upd, t.table, indexes)
	}
	return nil
}
