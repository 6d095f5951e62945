package atomicphase_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// bouncerModes are the pgx query exec modes that work through PgBouncer
// 1.18 in transaction pooling mode. Two do not, both for the same reason:
// PgBouncer may hand the next message sequence to another server
// connection once the server is idle, so nothing prepared in one sequence
// can be counted on in the next outside a transaction.
//   - cache_statement, pgx's default, prepares named statements: another
//     client meets "prepared statement stmtcache_... already exists"
//     (42P05) on a server connection that has it, or a missing one.
//   - describe_exec parses the unnamed statement and describes it in one
//     sequence, then binds and executes it in a second: the Bind finds no
//     unnamed statement (26000), or another client's, which then runs with
//     these arguments (seen as 22P02: a workflow name bound to a bigint).
var bouncerModes = map[string]pgx.QueryExecMode{
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
}

// A whole workflow through a real PgBouncer in transaction pooling mode:
// a new key, its replay, a phase error and the resume, a fingerprint
// mismatch, and concurrent duplicates spread over several server
// connections, once per exec mode PgBouncer supports.
func TestWorkflowThroughPgBouncer(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipWithoutPgBouncer(t)
	for name, mode := range bouncerModes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const clients = 16 // pooled client connections, over BouncerPoolSize server ones
			b := setupDB(t, &atomicphasetest.Options{
				SetupID:   testDBOpts.SetupID,
				Setup:     testDBOpts.Setup,
				PgBouncer: true,
				PoolConfig: func(cfg *pgxpool.Config) {
					cfg.ConnConfig.DefaultQueryExecMode = mode
					cfg.MaxConns = clients
				},
			}, nil)
			var c counters
			var failCharge bool
			var mu sync.Mutex
			wf := orderWorkflow(t, &c, hooks{
				afterCreate: func(ctx context.Context, tx pgx.Tx) error {
					// Hold the phase's server connection a moment, so
					// duplicates arrive while the key is locked.
					_, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", 0.05)
					return err
				},
				charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
					mu.Lock()
					fail := failCharge
					mu.Unlock()
					if fail {
						return errors.New("payment API unreachable")
					}
					return call.Do(ctx, func(ctx context.Context, key string) error {
						s.ChargeID = "ch_" + key
						return nil
					})
				},
			})

			// A new key runs every phase; its replay runs none.
			resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "new"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			replay, err := b.runner.Run(b.ctx, wf, asRetry(orderRequest("u", "new")))
			require.NoError(t, err)
			require.True(t, replay.Replayed)
			require.Equal(t, resp.Body, replay.Body)
			require.Equal(t, resp.Header.Get("Location"), replay.Header.Get("Location"))
			require.Equal(t, []int32{1, 1, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()})

			// Same key, another request: refused, nothing changes.
			other := orderRequest("u", "new")
			other.Params = []byte(`{"item": "rocket", "quantity": 2}`)
			_, err = b.runner.Run(b.ctx, wf, asRetry(other))
			require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)

			// A phase error rolls back and unlocks; the retry resumes there.
			mu.Lock()
			failCharge = true
			mu.Unlock()
			_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "resume"))
			var pe *atomicphase.PhaseError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "charge", pe.Phase)
			info, err := b.runner.Inspect(b.ctx, "u", "resume")
			require.NoError(t, err)
			require.Equal(t, "create", info.RecoveryPoint)
			require.False(t, info.Locked)
			mu.Lock()
			failCharge = false
			mu.Unlock()
			resp, err = b.runner.Run(b.ctx, wf, asRetry(orderRequest("u", "resume")))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			require.False(t, resp.Replayed)
			require.Equal(t, []int32{2, 3, 2}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()}, "the resume does not create again")

			// Concurrent duplicates, each retried like a client until it
			// gets an answer: the phases run once, every answer is the same.
			var (
				wg     sync.WaitGroup
				start  = make(chan struct{})
				bodies = make([]string, clients)
				errs   = make([]error, clients)
			)
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 200 {
						resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "dup"))
						if errors.Is(err, atomicphase.ErrInProgress) {
							time.Sleep(10 * time.Millisecond)
							continue
						}
						if err == nil {
							bodies[i] = string(resp.Body)
						}
						errs[i] = err
						return
					}
					errs[i] = errors.New("still in progress after 200 tries")
				}()
			}
			close(start)
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			for _, body := range bodies {
				require.Equal(t, bodies[0], body)
			}
			// A duplicate that arrives while the new key is still inside its
			// first transaction runs create's function too, and rolls it
			// back: count what committed.
			require.Equal(t, []int{3, 3}, []int{
				b.count(t, `SELECT count(*) FROM effects WHERE phase = 'create'`),
				b.count(t, `SELECT count(*) FROM effects WHERE phase = 'finish'`)})
			require.Equal(t, int32(4), c.charge.Load())
			require.Equal(t, 3, b.count(t, "SELECT count(*) FROM effects WHERE phase = 'create'"))

			// The clients really shared a few server connections.
			require.Greater(t, b.db.Pool.Stat().TotalConns(), int32(4), "client connections")
			// Client backends only: on Citus the coordinator also holds its
			// own connections to the database (its maintenance daemon, and
			// connections to itself named citus_internal).
			servers := b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND backend_type = 'client backend' AND application_name NOT LIKE 'citus_internal%'`)
			require.GreaterOrEqual(t, servers, 1, "server connections")
			require.LessOrEqual(t, servers, 4, "server connections")
			require.Less(t, int32(servers), b.db.Pool.Stat().TotalConns(), "more client connections than server connections: pooled")
			t.Logf("%d client connections over %d server connections", b.db.Pool.Stat().TotalConns(), servers)
		})
	}
}

// The guard a phase's transaction holds once the phase asked for Conn (a
// WITH HOLD cursor, closed just before the Runner's COMMIT) works through
// PgBouncer in transaction pooling mode: a phase using Conn commits, and a
// COMMIT sent through Conn by pgx.BeginFunc still fails and rolls back.
func TestPhaseTxGuardThroughPgBouncer(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipWithoutPgBouncer(t)
	for name, mode := range bouncerModes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, &atomicphasetest.Options{
				SetupID:   testDBOpts.SetupID,
				Setup:     testDBOpts.Setup,
				PgBouncer: true,
				PoolConfig: func(cfg *pgxpool.Config) {
					cfg.ConnConfig.DefaultQueryExecMode = mode
				},
			}, nil)
			type st = struct{}
			viaConn := atomicphase.MustWorkflow("via_conn", startEmpty[st], []atomicphase.Phase[st]{
				atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
					_, err := tx.Conn().Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'ok', 'write')`)
					return atomicphase.Respond(200, nil), err
				}),
			}, nil)
			_, err := b.runner.Run(b.ctx, viaConn, atomicphase.Request{Scope: "u", Key: "ok", Method: "POST", Path: "/c"})
			require.NoError(t, err)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'ok'`))

			escaping := escapeWorkflow("escaping", func(ctx context.Context, tx atomicphase.Tx) error {
				return pgx.BeginFunc(ctx, tx.Conn(), func(inner pgx.Tx) error {
					_, err := inner.Exec(ctx, insertEffect)
					return err
				})
			})
			_, err = b.runner.Run(b.ctx, escaping, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"})
			require.ErrorIs(t, err, atomicphase.ErrPhaseTxEscaped)
			require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE key = 'k'`))
		})
	}
}

// pgx's default exec mode behind a transaction-pooling PgBouncer parks keys
// with 42P05 as if the requests were at fault: CheckSchema tells at
// start-up, and says which mode to use; the modes that work pass.
func TestCheckSchemaTellsAnExecModeThatFailsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipWithoutPgBouncer(t)
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
	}
	for name, mode := range bouncerModes {
		modes[name] = mode
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, &atomicphasetest.Options{
				SetupID:   testDBOpts.SetupID,
				Setup:     testDBOpts.Setup,
				PgBouncer: true,
				PoolConfig: func(cfg *pgxpool.Config) {
					cfg.ConnConfig.DefaultQueryExecMode = mode
				},
			}, nil)
			err := b.runner.CheckSchema(b.ctx)
			if _, works := bouncerModes[name]; works {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, atomicphase.ErrExecModeUnsafe)
			require.ErrorContains(t, err, "QueryExecModeExec")
		})
	}
}
