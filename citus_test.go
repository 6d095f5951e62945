package atomicphase_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// The Citus deployment of docs/scale.md, checked in the Citus test mode
// (ATOMICPHASE_TEST_CITUS_URL): the key table and the functions are
// distributed as described, and a request whose phases write only their
// scope's rows runs every statement on one worker and commits there
// without two-phase commit, every write of the key table inside a
// function that runs beside the row.

func skipUnlessCitus(t *testing.T) {
	t.Helper()
	if !atomicphasetest.OnCitus() {
		t.Skip("needs the Citus test mode: set " + atomicphasetest.CitusURLEnv + " (docs/scale.md)")
	}
}

// On plain PostgreSQL, MigrateOpts.Citus asks for what is not there, and
// nothing is applied.
func TestMigrateForCitusWithoutCitus(t *testing.T) {
	t.Parallel()
	if atomicphasetest.OnCitus() {
		t.Skip("needs a database without the citus extension: the Citus test mode creates it in every one")
	}
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	applied, err := atomicphase.Migrate(t.Context(), db.Pool, &atomicphase.MigrateOpts{Citus: true})
	require.ErrorIs(t, err, atomicphase.ErrNoCitus)
	require.Empty(t, applied)
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname = 'idempotency_keys'").Scan(&n))
	require.Zero(t, n, "nothing was applied")
}

func TestMigrateDistributesOnCitus(t *testing.T) {
	t.Parallel()
	skipUnlessCitus(t)
	b := setup(t, nil)
	var column string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT column_to_column_name(logicalrelid, partkey)
		FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass`).Scan(&column))
	require.Equal(t, "scope", column)
	var colocated bool
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT h.colocationid = k.colocationid AND column_to_column_name(h.logicalrelid, h.partkey) = 'scope'
		FROM pg_dist_partition h, pg_dist_partition k
		WHERE h.logicalrelid = 'atomicphase_key_history'::regclass AND k.logicalrelid = 'idempotency_keys'::regclass`).Scan(&colocated))
	require.True(t, colocated, "a key's history lives on its shard")

	distribution := func() []string {
		rows, err := b.db.Pool.Query(b.ctx, `
			SELECT p.proname || ' by ' || (p.proargnames)[o.distribution_argument_index + 1]
			       || CASE WHEN o.force_delegation THEN ', forced' ELSE '' END
			FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
			WHERE o.classid = 'pg_proc'::regclass AND p.proname LIKE 'atomicphase\_%'
			  AND o.colocationid = (SELECT colocationid FROM pg_dist_partition
			                        WHERE logicalrelid = 'idempotency_keys'::regclass)
			ORDER BY 1`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return got
	}
	want := []string{
		"atomicphase_acquire by p_scope", "atomicphase_admit by p_scope", "atomicphase_admit by p_scope",
		"atomicphase_checkpoint by p_scope, forced", "atomicphase_claim by p_scope, forced",
		"atomicphase_key_event by p_scope",
		"atomicphase_record by p_scope, forced", "atomicphase_record by p_scope, forced", "atomicphase_record by p_scope, forced",
		"atomicphase_record_first by p_scope, forced", "atomicphase_record_resolution by p_scope", "atomicphase_record_unit by p_scope, forced",
		"atomicphase_record_verdict by p_scope",
		"atomicphase_release by p_scope", "atomicphase_release by p_scope", "atomicphase_release by p_scope",
		"atomicphase_renew by p_scope", "atomicphase_schedule by p_scope",
		"atomicphase_take by p_scope", "atomicphase_unpark by p_scope",
	}
	require.Equal(t, want, distribution(), "every function with a scope argument, colocated with the key table")

	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Citus: true})
	require.NoError(t, err, "distributing again is a no-op")
	require.Empty(t, applied)
	require.Equal(t, want, distribution())
}

// remoteCommands collects what the coordinator sends to the workers
// (citus.log_remote_commands) on a pool's connections.
type remoteCommands struct {
	mu   sync.Mutex
	sent []remoteCommand
}

type remoteCommand struct{ node, sql string }

var onServer = regexp.MustCompile(`on server \S+@(\S+) connectionId`)

func (rc *remoteCommands) poolConfig(cfg *pgxpool.Config) {
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		sql, ok := strings.CutPrefix(n.Message, "issuing ")
		m := onServer.FindStringSubmatch(n.Detail)
		if !ok || m == nil {
			return
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.sent = append(rc.sent, remoteCommand{node: m[1], sql: sql})
	}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SET citus.log_remote_commands = on")
		return err
	}
}

// take returns what was sent since the last take.
func (rc *remoteCommands) take() []remoteCommand {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.sent
	rc.sent = nil
	return out
}

func nodesOf(cmds []remoteCommand) []string {
	var nodes []string
	for _, c := range cmds {
		if !slices.Contains(nodes, c.node) {
			nodes = append(nodes, c.node)
		}
	}
	return nodes
}

func countMatching(cmds []remoteCommand, re string) int {
	n := 0
	for _, c := range cmds {
		if regexp.MustCompile(re).MatchString(c.sql) {
			n++
		}
	}
	return n
}

// tenantState is what tenantWorkflow's phases keep.
type tenantState struct {
	Scope   string `json:"scope"`
	Other   string `json:"other,omitempty"`
	OrderID int64  `json:"order_id"`
	Charge  string `json:"charge"`
}

// tenantWorkflow is create (local) → charge (foreign) → finish (responds),
// every phase writing only its own scope's rows of effects, which the
// Citus mode distributes by scope, colocated with the key table. With
// other set, create also writes a row of another scope.
func tenantWorkflow(t *testing.T, other string) *atomicphase.Workflow[tenantState] {
	t.Helper()
	start := func(_ struct{}, req *atomicphase.Request) (tenantState, error) {
		return tenantState{Scope: req.Scope, Other: other}, nil
	}
	return atomicphase.MustWorkflow("tenant", start, []atomicphase.Phase[tenantState]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *tenantState) (atomicphase.Outcome, error) {
			if err := tx.QueryRow(ctx, `INSERT INTO effects (scope, key, phase) VALUES ($1, 'k', 'create') RETURNING id`,
				s.Scope).Scan(&s.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			if s.Other != "" {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ($1, 'k', 'elsewhere')`, s.Other); err != nil {
					return atomicphase.Outcome{}, err
				}
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *tenantState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				s.Charge = "ch_" + key
				return nil
			})
		}, nil),
		atomicphase.Local("finish", func(ctx context.Context, tx atomicphase.Tx, s *tenantState) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `UPDATE effects SET note = $3 WHERE scope = $1 AND id = $2`, s.Scope, s.OrderID, s.Charge)
			return atomicphase.Respond(201, []byte(s.Charge)), err
		}),
	}, nil)
}

// workerOf returns the worker holding scope's shard of the key table.
func workerOf(t *testing.T, pool *pgxpool.Pool, scope string) string {
	t.Helper()
	var node string
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT nodename || ':' || nodeport FROM pg_dist_shard_placement
		WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, scope).Scan(&node))
	return node
}

func TestRequestRunsOnOneWorkerOnCitus(t *testing.T) {
	t.Parallel()
	skipUnlessCitus(t)
	var rc remoteCommands
	opts := *testDBOpts
	opts.PoolConfig = rc.poolConfig
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	ctx := t.Context()
	wf := tenantWorkflow(t, "")
	worker := workerOf(t, db.Pool, "tenant-1")
	rc.take()

	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "tenant-1", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	sent := rc.take()
	for _, c := range sent {
		t.Logf("%s: %s", c.node, c.sql)
	}
	require.Equal(t, []string{worker}, nodesOf(sent), "every statement went to the worker of the scope's shard")
	require.Zero(t, countMatching(sent, `^PREPARE TRANSACTION`), "no two-phase commit")
	require.Equal(t, 1, countMatching(sent, `atomicphase_claim\(`), "the key's claim is delegated, at the head of the first phase's transaction")
	require.Equal(t, 1, countMatching(sent, `atomicphase_record_unit\(`), "the recording is delegated, with the first phase's commit")
	require.NotZero(t, countMatching(sent, `atomicphase_checkpoint\(`), "the checkpoints are delegated")
	require.Zero(t, countMatching(sent, `(?i)^(UPDATE|INSERT INTO|DELETE FROM) \S*idempotency_keys`),
		"the coordinator writes the key table only through functions that run on the worker, with its clock")
	require.Equal(t, countMatching(sent, `^BEGIN `), countMatching(sent, `^COMMIT$`), "each transaction commits in one phase")

	replay, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "tenant-1", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	sent = rc.take()
	require.Equal(t, []string{worker}, nodesOf(sent))
	require.Len(t, sent, 1, "a replay is one primary-key read on the worker: %v", sent)

	rc.take()
	require.NoError(t, atomicphasetest.AgeLocks(ctx, db.Pool, atomicphase.DefaultLockTimeout))
	require.Len(t, nodesOf(rc.take()), 2, "AgeLocks, a test's helper, goes to every shard, as it means to")
}

// A phase that writes another scope's rows commits with two-phase commit
// when that scope lives on another worker: what docs/scale.md says to
// avoid, seen happening.
func TestPhaseWritingTwoWorkersCommitsInTwoPhasesOnCitus(t *testing.T) {
	t.Parallel()
	skipUnlessCitus(t)
	var rc remoteCommands
	opts := *testDBOpts
	opts.PoolConfig = rc.poolConfig
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	home := workerOf(t, db.Pool, "tenant-1")
	other := ""
	for _, s := range []string{"tenant-2", "tenant-3", "tenant-4", "tenant-5", "tenant-6", "tenant-7", "tenant-8"} {
		if workerOf(t, db.Pool, s) != home {
			other = s
			break
		}
	}
	require.NotEmpty(t, other, "a scope on the other worker")
	rc.take()
	resp, err := runner.Run(t.Context(), tenantWorkflow(t, other), atomicphase.Request{Scope: "tenant-1", Key: "k", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	sent := rc.take()
	require.Len(t, nodesOf(sent), 2)
	require.Equal(t, 2, countMatching(sent, `^PREPARE TRANSACTION`), "the first phase's transaction spans both workers")
	require.Equal(t, 2, countMatching(sent, `^COMMIT PREPARED`))
}

// An upgrade of a Citus cluster: the newest migration applied again to a
// key table already distributed (its down first). Migration 015 adds a
// column and a function, which Citus refused in one transaction after the
// column's parallel DDL over the shards, so every Rocket Rides server
// built with it failed to start on a cluster migrated before it.
func TestNewestMigrationAppliesOnADistributedKeyTable(t *testing.T) {
	t.Parallel()
	if !atomicphasetest.OnCitus() {
		t.Skip("the Citus test mode only (ATOMICPHASE_TEST_CITUS_URL)")
	}
	b := setup(t, nil)
	ms, err := atomicphase.Migrations(nil)
	require.NoError(t, err)
	newest := ms[len(ms)-1]
	// In one transaction, as Migrate runs a down (its SET LOCALs hold),
	// with multi-shard commands run in order, as Migrate runs them.
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL citus.multi_shard_modify_mode TO 'sequential'`); err != nil {
			return err
		}
		for _, stmt := range strings.Split(newest.Down, ";") { // a down of plain statements, no function bodies
			var code []string
			for _, line := range strings.Split(stmt, "\n") {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") {
					code = append(code, line)
				}
			}
			if sql := strings.TrimSpace(strings.Join(code, "\n")); sql != "" {
				if _, err := tx.Exec(b.ctx, sql); err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
			}
		}
		return nil
	}))
	_, err = b.db.Pool.Exec(b.ctx, "DELETE FROM atomicphase_migration WHERE version = $1", newest.Version)
	require.NoError(t, err)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Citus: true})
	require.NoError(t, err)
	require.Equal(t, []int{newest.Version}, applied)
	require.NoError(t, b.runner.CheckSchema(b.ctx))
}

// The rollout's first step on Citus: migrate to what this release needs,
// before migration 019 adds the history and 020 the function that records
// a key at the head of its unit, and distribute; then the rest, which
// distributes the history beside the keys, and the function.
func TestMigrateToMinVersionOnCitus(t *testing.T) {
	t.Parallel()
	skipUnlessCitus(t)
	b := setupDB(t, unmigratedDBOpts, nil)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion, Citus: true})
	require.NoError(t, err)
	require.Equal(t, atomicphase.MinVersion, applied[len(applied)-1])
	distributed := func(table string) bool {
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`, table).Scan(&ok))
		return ok
	}
	require.True(t, distributed("idempotency_keys"))
	applied, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Citus: true})
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	require.True(t, distributed("atomicphase_key_history"))
	var recordFirst bool
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_dist_object
		WHERE classid = 'pg_proc'::regclass AND objid = 'atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)'::regprocedure)`).Scan(&recordFirst))
	require.True(t, recordFirst, "migration 019's function is distributed once it exists")
	require.NoError(t, b.runner.CheckSchema(b.ctx))
}
