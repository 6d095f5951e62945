package apcitus_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apcitus"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

var _ atomicphase.Router = (*apcitus.Router)(nil)

// testStrings are scopes of every length up to 64 bytes (the hash reads 12
// bytes at a time and the rest one by one), multibyte ones, and random ones.
func testStrings() []string {
	out := []string{"", "a", "tenant-1", "user@example.com", "ünïcødé", "日本語のテナント", "🚀🚀🚀", "a\tb\nc"}
	for n := 1; n <= 64; n++ {
		out = append(out, strings.Repeat("x", n), strings.Repeat("é", n/2)+strings.Repeat("z", n%2))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		r := make([]rune, rng.IntN(40))
		for i := range r {
			switch rng.IntN(3) {
			case 0:
				r[i] = rune(1 + rng.IntN(0x7f))
			case 1:
				r[i] = rune(0x80 + rng.IntN(0x800))
			default:
				r[i] = rune(0x1f300 + rng.IntN(0x300))
			}
		}
		out = append(out, string(r))
	}
	return out
}

// The router hashes a scope as PostgreSQL's hashtext does, which Citus
// compares with each shard's range.
func TestHashTextIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	in := testStrings()
	rows, err := db.Pool.Query(t.Context(), `SELECT hashtext(s) FROM unnest($1::text[]) WITH ORDINALITY AS u(s, i) ORDER BY i`, in)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, want, len(in))
	for i, s := range in {
		require.Equal(t, want[i], apcitus.HashText(s), "hashtext(%q)", s)
	}
}

func TestNewRouterRefusesATableThatIsNotDistributed(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	// On PostgreSQL there is no shard map at all; on Citus, the migration
	// ledger is a local table of the coordinator.
	_, err := apcitus.NewRouter(t.Context(), db.Pool, &apcitus.Config{Table: "atomicphase_migration"})
	require.ErrorIs(t, err, apcitus.ErrNotDistributed)
	_, err = apcitus.NewRouter(t.Context(), db.Pool, &apcitus.Config{Table: "no_such_table"})
	require.ErrorIs(t, err, apcitus.ErrNotDistributed)
	_, err = apcitus.NewRouter(t.Context(), db.Pool, &apcitus.Config{Schema: "no_such_schema"})
	require.ErrorIs(t, err, apcitus.ErrNotDistributed)
	_, err = apcitus.NewRouter(t.Context(), nil, nil)
	require.Error(t, err)
}

// citusRouter gives the test a database on Citus and a Router of it that
// refreshes only when told to; it skips the test without Citus.
func citusRouter(t *testing.T) (*atomicphasetest.DB, *apcitus.Router) {
	t.Helper()
	skipUnlessCitus(t)
	db := atomicphasetest.NewDB(t, nil)
	router, err := apcitus.NewRouter(t.Context(), db.Pool, &apcitus.Config{Refresh: -1})
	require.NoError(t, err)
	t.Cleanup(router.Close)
	return db, router
}

func skipUnlessCitus(t *testing.T) {
	t.Helper()
	if !atomicphasetest.OnCitus() {
		t.Skip("needs Citus: set " + atomicphasetest.CitusURLEnv)
	}
}

// workerOf returns host:port of the worker holding scope's shard of the
// key table, as Citus computes it.
func workerOf(t *testing.T, pool *pgxpool.Pool, scope string) string {
	t.Helper()
	var node string
	require.NoError(t, pool.QueryRow(t.Context(), `
		SELECT nodename || ':' || nodeport FROM pg_dist_shard_placement
		WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, scope).Scan(&node))
	return node
}

// addr is where a pool connects, host:port.
func addr(p *pgxpool.Pool) string {
	c := p.Config().ConnConfig
	return c.Host + ":" + strconv.Itoa(int(c.Port))
}

func TestRouterSendsEachScopeToTheWorkerOfItsShard(t *testing.T) {
	t.Parallel()
	db, router := citusRouter(t)
	ctx := t.Context()

	nodes := router.Nodes()
	require.Len(t, nodes, 2, "the test cluster's two workers")
	var shards, count int
	for _, n := range nodes {
		shards += n.Shards
	}
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idempotency_keys'::regclass`).Scan(&count))
	require.Equal(t, count, shards, "every shard has a worker")
	pools := router.Pools()
	require.Len(t, pools, len(nodes))
	for i, n := range nodes {
		require.Equal(t, n.Host+":"+strconv.Itoa(n.Port), addr(pools[i]), "Pools is in the order of Nodes")
	}

	for i, scope := range testStrings()[:300] {
		p := router.Pool(scope)
		require.Equal(t, workerOf(t, db.Pool, scope), addr(p), "scope %q", scope)
		if i%50 == 0 {
			var port int
			require.NoError(t, p.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
			require.Equal(t, p.Config().ConnConfig.Port, uint16(port), "the pool reaches that worker")
		}
	}
}

// A shard that moved is reached through its old worker until the next
// refresh, and directly after it.
func TestRouterFollowsAShardThatMoved(t *testing.T) {
	t.Parallel()
	db, router := citusRouter(t)
	ctx := t.Context()
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{Router: router})
	require.NoError(t, err)
	wf := portWorkflow(t)

	const scope = "moving-tenant"
	from := router.Pool(scope)
	var to string
	for _, n := range router.Nodes() {
		if a := n.Host + ":" + strconv.Itoa(n.Port); a != addr(from) {
			to = a
		}
	}
	host, port, _ := strings.Cut(to, ":")
	_, err = db.Pool.Exec(ctx, `SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency_keys', $1::text),
		$2, $3::int, $4, $5::int, shard_transfer_mode := 'block_writes')`,
		scope, from.Config().ConnConfig.Host, from.Config().ConnConfig.Port, host, port)
	require.NoError(t, err)
	require.Equal(t, to, workerOf(t, db.Pool, scope))

	resp, err := runner.Run(ctx, wf, atomicphase.Request{Scope: scope, Key: "before-refresh", Method: "POST", Path: "/"})
	require.NoError(t, err, "the old worker forwards the statements")
	require.Equal(t, 201, resp.Status)

	require.NoError(t, router.Refresh(ctx))
	require.Equal(t, to, addr(router.Pool(scope)))
	resp, err = runner.Run(ctx, wf, atomicphase.Request{Scope: scope, Key: "after-refresh", Method: "POST", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, port, string(resp.Body), "the phase ran on the worker the shard moved to")
}

// portWorkflow's one phase answers with the port of the server it ran on.
func portWorkflow(t *testing.T) *atomicphase.Workflow[struct{}] {
	t.Helper()
	return atomicphase.MustWorkflow("port", func(struct{}, *atomicphase.Request) (struct{}, error) { return struct{}{}, nil },
		[]atomicphase.Phase[struct{}]{
			atomicphase.Local("answer", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
				var port int
				if err := tx.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil {
					return atomicphase.Outcome{}, err
				}
				return atomicphase.Respond(201, []byte(strconv.Itoa(port))), nil
			}),
		}, nil)
}

// A routed Runner's requests never reach the coordinator: every statement
// of a new key, a replay and an inspection runs on the scope's worker.
func TestRoutedRequestsLeaveTheCoordinatorOut(t *testing.T) {
	t.Parallel()
	db, router := citusRouter(t)
	ctx := t.Context()
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{Router: router})
	require.NoError(t, err)
	wf := portWorkflow(t)
	require.NoError(t, runner.Register(wf))
	require.NoError(t, runner.RecordVersions(ctx))
	twoPhase := func() (n int) {
		for _, p := range append([]*pgxpool.Pool{db.Pool}, router.Pools()...) {
			var c int
			require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM pg_dist_transaction`).Scan(&c))
			n += c
		}
		return n
	}
	prepared := twoPhase() // the database's set-up
	before := db.Pool.Stat().AcquireCount()
	for i := range 20 {
		scope := "tenant-" + strconv.Itoa(i)
		req := atomicphase.Request{Scope: scope, Key: "k", Method: "POST", Path: "/"}
		resp, err := runner.Run(ctx, wf, req)
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(int(router.Pool(scope).Config().ConnConfig.Port)), string(resp.Body))
		replay, err := runner.Run(ctx, wf, req)
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		info, err := runner.Inspect(ctx, scope, "k")
		require.NoError(t, err)
		require.Equal(t, atomicphase.KeyFinished, info.Status)
	}
	require.Equal(t, before, db.Pool.Stat().AcquireCount(), "nothing went through the coordinator's pool")
	// (Citus's recovery may remove the set-up's records meanwhile, never add.)
	require.LessOrEqual(t, twoPhase(), prepared, "no two-phase commit")
}

func BenchmarkHashText(b *testing.B) {
	scope := "rider000042@example.com"
	b.ReportAllocs()
	for b.Loop() {
		_ = apcitus.HashText(scope)
	}
}

// The Router hashes a scope's UTF-8 bytes, as a UTF8 database stores
// them: it refuses a database in another encoding, where Citus would hash
// other bytes.
func TestNewRouterRefusesADatabaseNotInUTF8(t *testing.T) {
	t.Parallel()
	if atomicphasetest.OnCitus() {
		t.Skip("the harness's Citus databases are all UTF8")
	}
	db := atomicphasetest.NewDB(t, nil)
	ctx := t.Context()
	name := db.Name + "_latin1"
	_, err := db.Pool.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
	})
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Database = name
	latin1, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer latin1.Close()
	_, err = apcitus.NewRouter(ctx, latin1, nil)
	require.ErrorContains(t, err, "encoding is LATIN1")
}
