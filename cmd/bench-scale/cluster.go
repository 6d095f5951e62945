package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// cluster is one configuration's servers: a plain PostgreSQL (workers ==
// 0), or a Citus coordinator and its workers, each a durable throwaway
// server of its own, on cores of its own when pinned.
type cluster struct {
	workers int
	nodes   []*pgtemp.Server // the coordinator (or the plain server) first
	cores   []string         // each node's CPUs, "" when not pinned
	admin   *pgxpool.Pool    // the coordinator's
}

// nodeSettings are every node's settings beyond pgtemp's durable ones
// (fsync, synchronous_commit and full_page_writes on), as bench-compare's:
// no checkpoint due during a run, room for every pool; on Citus, the shard
// count, and no recovery of two-phase commits, so that every one stays
// counted in pg_dist_transaction.
func nodeSettings(o *options, citus bool) []string {
	s := []string{
		"checkpoint_timeout=30min",
		"max_wal_size=4GB",
		fmt.Sprintf("max_connections=%d", 4*o.clients+100),
		"jit=off",
	}
	preload := []string{}
	if citus {
		preload = append(preload, "citus")
		s = append(s, "citus.recover_2pc_interval=-1", "citus.node_conninfo=sslmode=disable",
			fmt.Sprintf("citus.shard_count=%d", o.shards))
	}
	if o.pgss {
		preload = append(preload, "pg_stat_statements")
		s = append(s, "pg_stat_statements.track=all")
	}
	if len(preload) > 0 {
		s = append(s, "shared_preload_libraries="+strings.Join(preload, ","))
	}
	return s
}

// nodeCores returns the CPUs of node i (0: the coordinator) when pinning:
// o.nodeCores each, from o.firstCore.
func nodeCores(o *options, i int) string {
	if o.nodeCores == 0 {
		return ""
	}
	lo := o.firstCore + i*o.nodeCores
	return fmt.Sprintf("%d-%d", lo, lo+o.nodeCores-1)
}

// startCluster starts the servers of a configuration with workers workers
// (0: plain PostgreSQL), registers the workers, and migrates.
func startCluster(ctx context.Context, o *options, workers int) (_ *cluster, err error) {
	c := &cluster{workers: workers}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for i := 0; i <= workers; i++ {
		cores := nodeCores(o, i)
		srv, err := pgtemp.StartWith(ctx, &pgtemp.Options{Durable: true, Settings: nodeSettings(o, workers > 0), Cores: cores})
		if err != nil {
			return nil, fmt.Errorf("start node %d: %w", i, err)
		}
		c.nodes = append(c.nodes, srv)
		c.cores = append(c.cores, cores)
	}
	c.admin, err = pgxpool.New(ctx, c.nodes[0].URL)
	if err != nil {
		return nil, err
	}
	if workers > 0 {
		for _, n := range c.nodes {
			if err := execOn(ctx, n.URL, `CREATE EXTENSION citus`); err != nil {
				return nil, err
			}
		}
		host, port := hostPort(c.nodes[0].URL)
		if _, err := c.admin.Exec(ctx, `SELECT citus_set_coordinator_host($1, $2)`, host, port); err != nil {
			return nil, fmt.Errorf("citus_set_coordinator_host: %w", err)
		}
		for _, n := range c.nodes[1:] {
			host, port := hostPort(n.URL)
			if _, err := c.admin.Exec(ctx, `SELECT citus_add_node($1, $2)`, host, port); err != nil {
				return nil, fmt.Errorf("citus_add_node: %w", err)
			}
		}
	}
	if o.pgss { // on Citus, the coordinator propagates it to the workers
		if err := execOn(ctx, c.url(0), `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return nil, err
		}
	}
	// Throwaway servers no other role connects to.
	if _, err := atomicphase.Migrate(ctx, c.admin, &atomicphase.MigrateOpts{Citus: workers > 0, AllowPublicCreate: true}); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, stmt := range schema(workers > 0) {
		if _, err := c.admin.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("%s: %w", firstLine(stmt), err)
		}
	}
	return c, nil
}

// url returns node i's URL.
func (c *cluster) url(i int) string { return c.nodes[i].URL }

// dbCores is how many CPUs the configuration's servers have, 0 unpinned.
func (c *cluster) dbCores(o *options) int { return o.nodeCores * len(c.nodes) }

func (c *cluster) stop() {
	if c.admin != nil {
		c.admin.Close()
	}
	for _, n := range c.nodes {
		_ = n.Stop()
	}
}

// twoPhaseCommits counts the two-phase commits recorded on every node
// (recovery is off: none is removed).
func (c *cluster) twoPhaseCommits(ctx context.Context) (int64, error) {
	if c.workers == 0 {
		return 0, nil
	}
	var total int64
	for _, n := range c.nodes {
		var k int64
		if err := queryRow(ctx, n.URL, `SELECT count(*) FROM pg_dist_transaction`, &k); err != nil {
			return 0, err
		}
		total += k
	}
	return total, nil
}

// resetStatements empties pg_stat_statements on every node.
func (c *cluster) resetStatements(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := execOn(ctx, n.URL, `SELECT pg_stat_statements_reset()`); err != nil {
			return err
		}
	}
	return nil
}

// printStatements prints each node's top statements since the last reset,
// by total time, per answered request.
func (c *cluster) printStatements(ctx context.Context, out io.Writer, what string, answered int64) error {
	fmt.Fprintf(out, "    pg_stat_statements, %s (per request: calls, µs; nested statements included):\n", what)
	for i, n := range c.nodes {
		p, err := pgxpool.New(ctx, n.URL)
		if err != nil {
			return err
		}
		rows, err := p.Query(ctx, `SELECT calls, total_exec_time, regexp_replace(query, '\s+', ' ', 'g')
			FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 8`)
		if err != nil {
			p.Close()
			return err
		}
		var total float64
		var lines []string
		for rows.Next() {
			var calls int64
			var ms float64
			var q string
			if err := rows.Scan(&calls, &ms, &q); err != nil {
				rows.Close()
				p.Close()
				return err
			}
			total += ms
			if len(q) > 110 {
				q = q[:110] + "…"
			}
			lines = append(lines, fmt.Sprintf("      %5.2f %7.1f  %s", float64(calls)/float64(answered), ms*1000/float64(answered), q))
		}
		rows.Close()
		p.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		fmt.Fprintf(out, "    %s:\n%s\n", c.nodeName(i), strings.Join(lines, "\n"))
	}
	return nil
}

// nodeName names node i: the server, the coordinator or worker i.
func (c *cluster) nodeName(i int) string {
	switch {
	case i > 0:
		return fmt.Sprintf("worker %d", i)
	case c.workers == 0:
		return "server"
	}
	return "coordinator"
}

// nodeNames names every node, in order.
func (c *cluster) nodeNames() []string {
	names := make([]string, len(c.nodes))
	for i := range c.nodes {
		names[i] = c.nodeName(i)
	}
	return names
}

func execOn(ctx context.Context, u, sql string) error {
	p, err := pgxpool.New(ctx, u)
	if err != nil {
		return err
	}
	defer p.Close()
	if _, err := p.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

func queryRow(ctx context.Context, u, sql string, dst ...any) error {
	p, err := pgxpool.New(ctx, u)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.QueryRow(ctx, sql).Scan(dst...)
}

// hostPort returns a server URL's host and port.
func hostPort(u string) (string, int) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", 0
	}
	port, _ := strconv.Atoi(pu.Port())
	return pu.Hostname(), port
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// schema is the workload's tables, as Citus's multi-tenant model lays them
// out: users a reference table, the rest distributed by the rider (the
// request's scope), colocated with the key table. The same tables, not
// distributed, on plain PostgreSQL.
func schema(citus bool) []string {
	s := []string{
		`CREATE TABLE users (
			id       bigint PRIMARY KEY,
			email    text   NOT NULL UNIQUE,
			customer text   NOT NULL)`,
		`CREATE TABLE rides (
			rider            text             NOT NULL,
			id               bigserial,
			created_at       timestamptz      NOT NULL DEFAULT now(),
			idempotency_key  text             NOT NULL,
			user_id          bigint           NOT NULL REFERENCES users,
			origin_lat       double precision NOT NULL,
			origin_lon       double precision NOT NULL,
			target_lat       double precision NOT NULL,
			target_lon       double precision NOT NULL,
			stripe_charge_id text,
			PRIMARY KEY (rider, id))`,
		`CREATE INDEX rides_rider_key_idx ON rides (rider, idempotency_key)`,
		`CREATE TABLE outbox (
			rider           text        NOT NULL,
			id              bigserial,
			created_at      timestamptz NOT NULL DEFAULT now(),
			idempotency_key text        NOT NULL,
			topic           text        NOT NULL,
			payload         jsonb       NOT NULL,
			PRIMARY KEY (rider, id))`,
		`CREATE TABLE hw_idempotency_keys (
			scope           text        NOT NULL,
			idempotency_key text        NOT NULL,
			request_hash    bytea       NOT NULL,
			response_status integer,
			response_body   bytea,
			created_at      timestamptz NOT NULL DEFAULT now(),
			finished_at     timestamptz,
			PRIMARY KEY (scope, idempotency_key))`,
	}
	if citus {
		s = append(s,
			`SELECT create_reference_table('users')`,
			`SELECT create_distributed_table('rides', 'rider', colocate_with := 'idempotency_keys')`,
			`SELECT create_distributed_table('outbox', 'rider', colocate_with := 'idempotency_keys')`,
			`SELECT create_distributed_table('hw_idempotency_keys', 'scope', colocate_with := 'idempotency_keys')`)
	}
	return s
}

var errVerify = errors.New("verification failed")
