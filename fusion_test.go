package atomicphase_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// commitCounter is a pgx tracer counting commits: COMMIT statements, and
// writing statements sent outside a transaction block (each its own
// transaction).
// commitCounter counts commits: a COMMIT, a write sent alone outside a
// transaction block, and a batch sent outside one that writes (its
// implicit transaction commits when the batch ends).
type commitCounter struct {
	n atomic.Int64
	// begins counts the BEGINs sent in batches.
	begins atomic.Int64
	// implicit is, per connection, whether the batch it is sending runs
	// outside a transaction block and writes.
	mu       sync.Mutex
	implicit map[*pgx.Conn]*implicitBatch
}

type implicitBatch struct{ inBlock, writes bool }

var writes = regexp.MustCompile(`(?i)^\s*(INSERT|UPDATE|DELETE)\b|atomicphase_(acquire|admit|checkpoint|record_unit|record_first)\(`)

func (c *commitCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "COMMIT" || (conn.PgConn().TxStatus() == 'I' && writes.MatchString(d.SQL)) {
		c.n.Add(1)
	}
	return ctx
}
func (c *commitCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *commitCounter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.implicit == nil {
		c.implicit = map[*pgx.Conn]*implicitBatch{}
	}
	c.implicit[conn] = &implicitBatch{inBlock: conn.PgConn().TxStatus() != 'I'}
	return ctx
}
func (c *commitCounter) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.implicit[conn]
	switch {
	case d.SQL == "COMMIT":
		c.n.Add(1)
		b.inBlock = false
	case strings.HasPrefix(strings.ToLower(d.SQL), "begin"):
		c.begins.Add(1)
		b.inBlock = true
	case !b.inBlock && d.Err == nil && writes.MatchString(d.SQL):
		b.writes = true
	}
}
func (c *commitCounter) TraceBatchEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchEndData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.implicit[conn]; b != nil && b.writes && d.Err == nil {
		c.n.Add(1)
	}
	delete(c.implicit, conn)
}

// setupCounting is setup with a commitCounter tracing the Runner's pool.
func setupCounting(t *testing.T) (*testBundle, *commitCounter) {
	t.Helper()
	commits := &commitCounter{}
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = commits }
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	return &testBundle{db: db, runner: runner, ctx: context.Background()}, commits
}

// fusedState is the state of fusedWorkflow.
type fusedState struct {
	ChargeID string `json:"charge_id"`
}

// fusedWorkflow is prepare → reserve (local, local) → charge (foreign,
// recording its result) → finish (local, responding), each writing one
// effects row. calls counts the foreign calls per downstream key.
func fusedWorkflow(t *testing.T, calls *sync.Map, hooks map[string]func(context.Context, atomicphase.Tx) error) *atomicphase.Workflow[fusedState] {
	t.Helper()
	local := func(name string, respond bool) atomicphase.LocalFunc[fusedState] {
		return func(ctx context.Context, tx atomicphase.Tx, s *fusedState) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', $1, $2)`, name, s.ChargeID)
			if h := hooks[name]; h != nil {
				if err := h(ctx, tx); err != nil {
					return atomicphase.Outcome{}, err
				}
			}
			if respond {
				return atomicphase.Respond(201, []byte(s.ChargeID)), nil
			}
			return atomicphase.Continue(), nil
		}
	}
	wf, err := atomicphase.NewWorkflow("fused", startEmpty[fusedState], []atomicphase.Phase[fusedState]{
		atomicphase.Local("prepare", local("prepare", false)),
		atomicphase.Local("reserve", local("reserve", false)),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *fusedState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				n, _ := calls.LoadOrStore(key, new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
				s.ChargeID = "ch_" + key[:8]
				return nil
			})
		}, local("charge", false)),
		atomicphase.Local("finish", local("finish", true)),
	}, nil)
	require.NoError(t, err)
	return wf
}

func callsMade(calls *sync.Map) (keys int, total int32) {
	calls.Range(func(_, v any) bool {
		keys++
		total += v.(*atomic.Int32).Load()
		return true
	})
	return keys, total
}

// A request commits once per foreign phase, plus once: the key's recording
// and the local phases before the call share one transaction, the call's
// record step and the local phases after it another.
func TestFusedRequestCommitsOncePerForeignPhasePlusOnce(t *testing.T) {
	t.Parallel()
	b, commits := setupCounting(t)
	runner := b.runner
	var calls sync.Map
	wf := fusedWorkflow(t, &calls, nil)
	// The process records its workflow's version once, before its first
	// request of it would: not part of a request.
	require.NoError(t, runner.Register(wf))
	require.NoError(t, runner.RecordVersions(b.ctx))

	commits.n.Store(0)
	resp, err := runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/f"})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, int64(2), commits.n.Load(), "one commit before the call, one after")
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM effects`))

	// CommitEachPhase: the recording and every phase commit on their own.
	each := atomicphase.MustWorkflow("each", startEmpty[fusedState], []atomicphase.Phase[fusedState]{
		atomicphase.Local("a", func(context.Context, atomicphase.Tx, *fusedState) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("b", func(context.Context, atomicphase.Tx, *fusedState) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	require.NoError(t, runner.Register(each))
	require.NoError(t, runner.RecordVersions(b.ctx))
	commits.n.Store(0)
	_, err = runner.Run(b.ctx, each, atomicphase.Request{Scope: "u", Key: "each", Method: "POST", Path: "/e"})
	require.NoError(t, err)
	require.Equal(t, int64(3), commits.n.Load(), "the recording, a and b")
}

// A crash inside a fused transaction rolls it all back: the retry runs it
// again from its first phase, and a foreign phase's call, whose record step
// rolled back, goes out again under the same downstream key.
func TestCrashInsideAFusedTransactionResumesAtItsFirstPhase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		phase      string
		place      atomicphase.FaultPlace
		recovery   string // the recovery point the crash leaves; "" when the key is not there
		callsFirst int32  // calls made by the crashed attempt
	}{
		{"reserve", atomicphase.BeforeCommit, "", 0},
		{"finish", atomicphase.BeforePhase, "reserve", 1},
		{"finish", atomicphase.BeforeCommit, "reserve", 1},
	} {
		t.Run(tc.phase+":"+string(tc.place), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{FaultInjector: crashOnce(tc.phase, tc.place)})
			var calls sync.Map
			wf := fusedWorkflow(t, &calls, nil)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/f"}
			_, err := b.runner.Run(b.ctx, wf, req)
			require.ErrorIs(t, err, atomicphase.ErrCrashed)
			require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE phase IN ('charge', 'finish')`), "rolled back")
			info, err := b.runner.Inspect(b.ctx, "u", "k")
			if tc.recovery == "" {
				require.ErrorIs(t, err, atomicphase.ErrKeyNotFound, "the key's recording rolled back with prepare and reserve")
			} else {
				require.NoError(t, err)
				require.Equal(t, tc.recovery, info.RecoveryPoint)
			}
			_, total := callsMade(&calls)
			require.Equal(t, tc.callsFirst, total)

			ageLocks(t, b)
			resp, err := b.runner.Run(b.ctx, wf, req)
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			keys, _ := callsMade(&calls)
			require.Equal(t, 1, keys, "every call carried the same downstream key")
			for _, phase := range []string{"prepare", "reserve", "charge", "finish"} {
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = $1`, phase), phase)
			}
		})
	}
}

// A phase that fails after a foreign phase's record step, in the
// transaction they share, does not cost the call's result: it is committed
// on its own, and the retry does not call again.
func TestFailureAfterACallKeepsTheCallsResult(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls sync.Map
	var fail atomic.Bool
	fail.Store(true)
	wf := fusedWorkflow(t, &calls, map[string]func(context.Context, atomicphase.Tx) error{
		"finish": func(context.Context, atomicphase.Tx) error {
			if fail.Load() {
				return errors.New("transient")
			}
			return nil
		},
	})
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/f"}
	_, err := b.runner.Run(b.ctx, wf, req)
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "finish", pe.Phase)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "charge", info.RecoveryPoint, "the call's result was committed on its own")
	require.False(t, info.Locked)

	fail.Store(false)
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	_, total := callsMade(&calls)
	require.Equal(t, int32(1), total, "the retry did not call again")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = 'charge'`))
}

// A queued statement's failure is charged to the phase that queued it,
// even when it surfaces while a later phase of the same transaction sends.
func TestQueuedStatementFailureIsChargedToItsPhase(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var refusedIn []string
	b := setup(t, &atomicphase.Config{Observer: atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		if e.Kind == atomicphase.EventDataRefused {
			mu.Lock()
			refusedIn = append(refusedIn, e.Phase)
			mu.Unlock()
		}
	})})
	type st struct{}
	wf := atomicphase.MustWorkflow("queued", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("bad", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', NULL)`) // phase is NOT NULL
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("reads", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/q"})
	require.NoError(t, err)
	require.Equal(t, 422, resp.Status, "a NOT NULL violation fails the same way every time: the request's final answer")
	mu.Lock()
	require.Equal(t, []string{"bad"}, refusedIn)
	mu.Unlock()
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
}

// Queued statements run in order, before anything the phase (or a later
// phase of the transaction) sends next: a read sees the queued writes.
func TestQueuedWritesAreVisibleToLaterReads(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct {
		Seen int `json:"seen"`
	}
	wf := atomicphase.MustWorkflow("visible", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'one')`)
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'two')`)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("read", func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&s.Seen); err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Respond(200, []byte{byte('0' + s.Seen)}), nil
		}),
	}, nil)
	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/v"})
	require.NoError(t, err)
	require.Equal(t, "2", string(resp.Body))
}

// A duplicate that arrives while a new key is inside its first, fused
// transaction does not wait for that transaction: it is told at once that
// the key is in progress, and nothing it ran speculatively survives.
func TestDuplicateDoesNotWaitForTheFusedTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls sync.Map
	entered, release := make(chan struct{}), make(chan struct{})
	var holders atomic.Int32
	wf := fusedWorkflow(t, &calls, map[string]func(context.Context, atomicphase.Tx) error{
		"reserve": func(ctx context.Context, tx atomicphase.Tx) error {
			// An immediate statement sends the key's recording.
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			if holders.Add(1) == 1 {
				close(entered)
				<-release
			}
			return nil
		},
		"charge": func(context.Context, atomicphase.Tx) error { return nil },
	})
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/f"}

	first := make(chan error, 1)
	go func() { _, err := b.runner.Run(b.ctx, wf, req); first <- err }()
	<-entered
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInProgress, "refused while the key's recording is uncommitted")
	close(release)
	require.NoError(t, <-first)
	_, total := callsMade(&calls)
	require.Equal(t, int32(1), total)
	for _, phase := range []string{"prepare", "reserve", "charge", "finish"} {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = $1`, phase), phase)
	}
}

// A unit whose statements were all queued goes as one batch. On one
// PostgreSQL it goes without BEGIN and COMMIT: the batch's implicit
// transaction commits the key's recording, the phase's writes and the
// recovery point together, and a statement that fails in it rolls back all
// of it. On Citus, where the statements of such a batch would commit one
// by one, it is sent inside BEGIN and COMMIT.
func TestQueuedUnitCommitsAsOneBatch(t *testing.T) {
	t.Parallel()
	b, commits := setupCounting(t)
	runner := b.runner
	type st struct{}
	var fail atomic.Bool
	wf := atomicphase.MustWorkflow("batched", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'one')`)
			if fail.Load() {
				// A write that fails after the first: phase is NOT NULL.
				tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', NULL)`)
			}
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'two')`)
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	require.NoError(t, runner.Register(wf))
	require.NoError(t, runner.RecordVersions(b.ctx))
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/b"}

	fail.Store(true)
	commits.begins.Store(0)
	resp, err := runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 422, resp.Status, "a NOT NULL violation is the request's final answer")
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "the write before the failure rolled back with it")
	if !atomicphasetest.OnCitus() {
		require.Zero(t, commits.begins.Load(), "the failed unit was sent without BEGIN")
	}

	fail.Store(false)
	commits.n.Store(0)
	commits.begins.Store(0)
	req.Key = "fresh" // a new key: recorded with the unit
	resp, err = runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, int64(1), commits.n.Load(), "one commit")
	if atomicphasetest.OnCitus() {
		require.Equal(t, int64(1), commits.begins.Load(), "on Citus, inside BEGIN and COMMIT")
	} else {
		require.Zero(t, commits.begins.Load(), "on one PostgreSQL, without BEGIN")
	}
}

// A unit that queued a statement other than a row's read or write keeps
// BEGIN and COMMIT: LOCK TABLE needs a transaction block, and a procedure
// that commits is refused inside one, where in an implicit transaction it
// would commit the statements queued before it for good.
func TestQueuedStatementsThatNeedATransactionBlock(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.db.Pool.Exec(b.ctx, `CREATE PROCEDURE commits() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$`)
	require.NoError(t, err)
	type st struct{}
	wf := atomicphase.MustWorkflow("blocks", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`LOCK TABLE effects IN SHARE ROW EXCLUSIVE MODE`)
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'one')`)
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "lock", Method: "POST", Path: "/b"})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))

	wf = atomicphase.MustWorkflow("calls", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'two')`)
			tx.Queue(`CALL commits()`)
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "call", Method: "POST", Path: "/b"})
	require.Error(t, err, "the procedure's COMMIT is refused inside the phase's transaction")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "and the write before it rolled back")
}

// A queued statement that cannot even be prepared fails the batch before
// the key's claim runs: that is the statement's error, not the claim's
// refusal (which would send the request round again as an existing key's,
// running its phase twice).
func TestUnpreparableStatementIsNotAClaimRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	var runs atomic.Int32
	wf := atomicphase.MustWorkflow("badsql", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			runs.Add(1)
			tx.Queue(`INSERT INTO no_such_table (x) VALUES (1)`)
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	require.NoError(t, b.runner.Register(wf))
	require.NoError(t, b.runner.RecordVersions(b.ctx))
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/x"})
	require.Error(t, err)
	require.ErrorContains(t, err, "no_such_table", "the statement's own error")
	require.Equal(t, int32(1), runs.Load(), "the phase ran once")
}

// A finished key's retry, unmarked, is answered from the store even when
// the first unit's statements, built ahead of the key's read, can no
// longer be prepared (the code changed since, or a table went away): the
// read's answer is the request's, and the batch's failure is not.
func TestAFinishedKeysReplayIsItsAnswerWhenItsUnitCannotBePrepared(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	table := "effects"
	wf := atomicphase.MustWorkflow("changing", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO ` + table + ` (scope, key, phase) VALUES ('u', 'k', 'write')`)
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/x"}
	first, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	table = "no_such_table"
	for range 2 {
		resp, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		require.Equal(t, first.Body, resp.Body)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}
