// Package apcitus routes each request of an atomicphase Runner to the Citus
// worker that holds its tenant's rows, so that the coordinator leaves the
// request's path:
//
//	router, err := apcitus.NewRouter(ctx, pool, nil) // pool: the coordinator's
//	defer router.Close()
//	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{Router: router})
//
// The key table is distributed by scope (docs/scale.md), and the
// application's tables that a workflow writes are colocated with it, so
// every statement of one request (the key's acquisition, the phases, the
// recovery points, the renewals) is about one shard. The Router reads from
// Citus's metadata which worker holds each shard of the key table, opens
// a pool to each worker, and hashes a scope the way Citus does (the text
// value's hash, compared with each shard's range) to choose one: each
// statement then runs on the worker that owns its rows, in one hop,
// without the coordinator planning it and forwarding it.
//
// Routing is a matter of speed, never of correctness: every worker has the
// cluster's metadata (Citus syncs it to every node by default), so a
// statement sent to the wrong worker (a shard moved since the last
// refresh, say) is forwarded by that worker to the right one, as the
// coordinator would have done. The Router refreshes its map every
// Config.Refresh and on Refresh.
package apcitus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Config configures a Router. The zero value is valid.
type Config struct {
	// Table is the distributed table whose shards are followed: the key
	// table, which every table a workflow writes is colocated with. An
	// unqualified name, in Schema. Defaults to "idempotency_keys".
	Table string
	// Schema is the schema that holds the key table, as given to
	// atomicphase's Config.Schema. Defaults to "" (the search_path).
	Schema string
	// Refresh is how often the shard map is read again, so that requests
	// follow shards that moved (a rebalance, a worker added). Between
	// refreshes a moved shard's requests are forwarded by the worker they
	// reach. Negative: never (call Router.Refresh yourself). Defaults to
	// one minute.
	Refresh time.Duration
	// Address maps a worker as Citus's metadata names it (pg_dist_node's
	// nodename and nodeport) to the host and port this process connects
	// to, for a network where the two differ. Defaults to the metadata's.
	Address func(host string, port int) (string, int)
	// PoolConfig adjusts the configuration of each worker's pool, a copy of
	// the entry pool's with the worker's host and port; the pool size, say
	// (each worker's pool defaults to the entry pool's size). Defaults to
	// none.
	PoolConfig func(cfg *pgxpool.Config)
	// OnRefreshError receives the error of a periodic refresh that failed;
	// the previous map stays in use. Defaults to none.
	OnRefreshError func(error)
}

// ErrNotDistributed is returned by NewRouter when the table is not a
// hash-distributed Citus table (or the database has no citus extension).
var ErrNotDistributed = errors.New("apcitus: the key table is not hash-distributed on Citus (atomicphase.MigrateOpts.Citus distributes it)")

// Node is a worker the Router sends requests to.
type Node struct {
	// Host and Port are where the Router connects (after Config.Address).
	Host string
	Port int
	// Shards is how many of the table's shards it holds.
	Shards int
}

// Router is an atomicphase.Router for Citus: it sends each scope to the
// worker holding its shard. It is safe for concurrent use.
type Router struct {
	entry *pgxpool.Pool
	cfg   Config
	table string // the quoted, qualified table name

	shards atomic.Pointer[shardMap]

	mu      sync.Mutex
	pools   map[string]*pgxpool.Pool // by host:port, kept until Close
	closed  bool
	stop    context.CancelFunc
	stopped chan struct{}
}

// shardMap is one reading of the metadata: the shards' ranges in order,
// each with its worker's pool.
type shardMap struct {
	min       []int32 // each shard's lowest hash, ascending
	max       []int32
	pools     []*pgxpool.Pool
	nodes     []Node
	nodePools []*pgxpool.Pool // each node's, in nodes' order
}

// NewRouter reads the key table's shard map through entry (the
// coordinator's pool; any worker's reads it too, but the Runner's own pool
// must reach the coordinator, where the workflow versions and the audit
// trail live), connects a pool to each worker
// that holds shards, and starts refreshing the map every Config.Refresh.
// config may be nil. Close the Router before entry.
func NewRouter(ctx context.Context, entry *pgxpool.Pool, config *Config) (*Router, error) {
	if entry == nil {
		return nil, errors.New("apcitus: NewRouter needs the entry pool")
	}
	var cfg Config
	if config != nil {
		cfg = *config
	}
	if cfg.Table == "" {
		cfg.Table = keystore.Table
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = time.Minute
	}
	table := pgx.Identifier{cfg.Table}.Sanitize()
	if cfg.Schema != "" {
		table = pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	}
	var encoding string
	if err := entry.QueryRow(ctx, `SELECT current_setting('server_encoding')`).Scan(&encoding); err != nil {
		return nil, fmt.Errorf("apcitus: %w", err)
	}
	if encoding != "UTF8" && encoding != "SQL_ASCII" {
		// hashtext hashes the value's bytes as the database stores them.
		return nil, fmt.Errorf("apcitus: the database's encoding is %s: the Router hashes scopes as UTF-8 bytes, which a UTF8 (or SQL_ASCII) database stores", encoding)
	}
	r := &Router{entry: entry, cfg: cfg, table: table, pools: map[string]*pgxpool.Pool{}}
	if err := r.Refresh(ctx); err != nil {
		r.Close()
		return nil, err
	}
	if cfg.Refresh > 0 {
		rctx, stop := context.WithCancel(context.Background())
		r.stop, r.stopped = stop, make(chan struct{})
		go r.refreshEvery(rctx)
	}
	return r, nil
}

// Pool returns the pool of the worker that holds scope's shard, as the
// last refresh saw it; the entry pool when no shard covers the scope's
// hash (which a complete shard map never leaves).
func (r *Router) Pool(scope string) *pgxpool.Pool {
	m := r.shards.Load()
	h := hashText(scope)
	// The first shard whose range ends at or after h.
	i := sort.Search(len(m.max), func(i int) bool { return m.max[i] >= h })
	if i < len(m.min) && m.min[i] <= h {
		return m.pools[i]
	}
	return r.entry
}

// Nodes lists the workers of the current map, in the order of their
// shards' ranges.
func (r *Router) Nodes() []Node {
	return append([]Node(nil), r.shards.Load().nodes...)
}

// Pools returns each worker's pool, in the order of Nodes: to warm them
// up, say, or to read their statistics.
func (r *Router) Pools() []*pgxpool.Pool {
	return append([]*pgxpool.Pool(nil), r.shards.Load().nodePools...)
}

// Refresh reads the shard map again, now, and opens a pool to any worker
// new to it. Requests already routed finish where they are.
func (r *Router) Refresh(ctx context.Context) error {
	rows, err := r.entry.Query(ctx, `
		SELECT s.shardminvalue::integer, s.shardmaxvalue::integer, n.nodename, n.nodeport
		FROM pg_dist_partition p
		JOIN pg_dist_shard s ON s.logicalrelid = p.logicalrelid
		JOIN pg_dist_placement pl ON pl.shardid = s.shardid
		JOIN pg_dist_node n ON n.groupid = pl.groupid
		WHERE p.logicalrelid = $1::regclass AND p.partmethod = 'h'
		  AND n.isactive AND n.noderole = 'primary'
		ORDER BY 1, 3, 4`, r.table)
	if err != nil {
		return mapError(err)
	}
	type shard struct {
		min, max int32
		host     string
		port     int
	}
	shards, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (shard, error) {
		var s shard
		return s, row.Scan(&s.min, &s.max, &s.host, &s.port)
	})
	if err != nil {
		return mapError(err)
	}
	if len(shards) == 0 {
		return ErrNotDistributed
	}
	m := &shardMap{}
	counts := map[string]int{}
	var order []string
	byAddr := map[string]*pgxpool.Pool{}
	for i, s := range shards {
		if i > 0 && s.min == shards[i-1].min {
			continue // a second placement (replication): the first serves all
		}
		host, port := s.host, s.port
		if r.cfg.Address != nil {
			host, port = r.cfg.Address(host, port)
		}
		p, err := r.poolOf(ctx, host, port)
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		if counts[addr] == 0 {
			order = append(order, addr)
			byAddr[addr] = p
		}
		counts[addr]++
		m.min, m.max, m.pools = append(m.min, s.min), append(m.max, s.max), append(m.pools, p)
	}
	for _, addr := range order {
		host, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		m.nodes = append(m.nodes, Node{Host: host, Port: n, Shards: counts[addr]})
		m.nodePools = append(m.nodePools, byAddr[addr])
	}
	r.shards.Store(m)
	return nil
}

// mapError is the error of reading the shard map: ErrNotDistributed when
// there is no map to read (no citus extension, or no such table).
func mapError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "3F000") {
		return fmt.Errorf("%w: %w", ErrNotDistributed, err)
	}
	return fmt.Errorf("apcitus: read the shard map: %w", err)
}

// poolOf returns the pool of the worker at host:port, opening it on first
// need.
func (r *Router) poolOf(ctx context.Context, host string, port int) (*pgxpool.Pool, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("apcitus: the Router is closed")
	}
	if p, ok := r.pools[addr]; ok {
		return p, nil
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("apcitus: worker %s: port out of range", addr)
	}
	cfg := workerConfig(r.entry.Config(), host, uint16(port))
	if r.cfg.PoolConfig != nil {
		r.cfg.PoolConfig(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("apcitus: connect to worker %s: %w", addr, err)
	}
	r.pools[addr] = p
	return p, nil
}

// workerConfig is entry's pool configuration for the worker at host:port:
// the same settings, the same TLS modes tried in the same order (sslmode
// prefer tries TLS, then none; allow, the reverse), each with the worker's
// name as the TLS server name.
func workerConfig(entry *pgxpool.Config, host string, port uint16) *pgxpool.Config {
	cfg := entry.Copy()
	cc := cfg.ConnConfig
	retarget := func(t *tls.Config) *tls.Config {
		if t == nil {
			return nil
		}
		t = t.Clone()
		t.ServerName = host
		return t
	}
	seen := map[bool]bool{cc.TLSConfig != nil: true}
	var fallbacks []*pgconn.FallbackConfig
	for _, fb := range cc.Fallbacks {
		if seen[fb.TLSConfig != nil] {
			continue // the entry's other hosts: one worker has one address
		}
		seen[fb.TLSConfig != nil] = true
		fallbacks = append(fallbacks, &pgconn.FallbackConfig{Host: host, Port: port, TLSConfig: retarget(fb.TLSConfig)})
	}
	cc.Host, cc.Port, cc.TLSConfig, cc.Fallbacks = host, port, retarget(cc.TLSConfig), fallbacks
	return cfg
}

func (r *Router) refreshEvery(ctx context.Context) {
	defer close(r.stopped)
	t := time.NewTicker(r.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.Refresh(rctx)
		cancel()
		if err != nil && ctx.Err() == nil && r.cfg.OnRefreshError != nil {
			r.cfg.OnRefreshError(err)
		}
	}
}

// Close stops the refreshing and closes the workers' pools (not the entry
// pool), waiting for their connections to be released: close the Router
// after the Runner's last request.
func (r *Router) Close() {
	if r.stop != nil {
		r.stop()
		<-r.stopped
	}
	r.mu.Lock()
	r.closed = true
	pools := r.pools
	r.pools = nil
	r.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
}
