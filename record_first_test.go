package atomicphase_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

// batchLog is a pgx tracer keeping the statements of every batch sent,
// in the order the batches started.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string
	current map[*pgx.Conn]int // the batch each connection is sending
}

func (l *batchLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (l *batchLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *batchLog) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current == nil {
		l.current = map[*pgx.Conn]int{}
	}
	l.current[conn] = len(l.batches)
	l.batches = append(l.batches, []string{})
	return ctx
}
func (l *batchLog) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i, ok := l.current[conn]; ok {
		l.batches[i] = append(l.batches[i], d.SQL)
	}
}
func (l *batchLog) TraceBatchEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.current, conn)
}

// calls returns, per batch sent since the last reset, the atomicphase_
// functions its statements call, in order, and forgets them.
func (l *batchLog) calls() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [][]string
	for _, b := range l.batches {
		var fns []string
		for _, sql := range b {
			if strings.HasPrefix(sql, "/* atomicphase: read the key */") {
				fns = append(fns, "read")
			} else if i := strings.Index(sql, "atomicphase_"); i >= 0 {
				fns = append(fns, sql[i:i+strings.IndexByte(sql[i:], '(')])
			} else {
				fns = append(fns, strings.Fields(sql)[0])
			}
		}
		out = append(out, fns)
	}
	l.batches = nil
	l.current = map[*pgx.Conn]int{}
	return out
}

// units is calls, each batch without the BEGIN and COMMIT around it on
// Citus, where every unit goes inside them: the unit's own statements.
func (l *batchLog) units() [][]string {
	calls := l.calls()
	if !atomicphasetest.OnCitus() {
		return calls
	}
	for i, b := range calls {
		if len(b) > 0 && b[0] == "begin" {
			b = b[1:]
		}
		if len(b) > 0 && b[len(b)-1] == "COMMIT" {
			b = b[:len(b)-1]
		}
		calls[i] = b
	}
	return calls
}

// claimHeld reports whether some backend holds the claim's advisory lock
// on scope and key (atomicphase_claim's and atomicphase_record_first's:
// hashtextextended of scope, chr(31), key, seed 7), on Citus on any
// worker.
func claimHeld(t *testing.T, db *atomicphasetest.DB, scope, key string) bool {
	t.Helper()
	const held = `SELECT count(*) FROM pg_locks l, (SELECT hashtextextended(%s || chr(31) || %s, 7) AS h) k
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND l.classid::bigint = (k.h >> 32) & 4294967295 AND l.objid::bigint = k.h & 4294967295`
	ctx := context.Background()
	var n int
	var err error
	if atomicphasetest.OnCitus() {
		err = db.Pool.QueryRow(ctx, `SELECT coalesce(sum(result::int), 0) FROM run_command_on_workers($1)`,
			fmt.Sprintf(held, quoteLiteral(scope), quoteLiteral(key))).Scan(&n)
	} else {
		err = db.Pool.QueryRow(ctx, fmt.Sprintf(held, "$1::text", "$2::text"), scope, key).Scan(&n)
	}
	require.NoError(t, err)
	return n > 0
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// postKey is a POST of key in scope u.
func postKey(key string) atomicphase.Request {
	return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/w"}
}

// recordFirstDB is a database migrated to target (0 for all), with setup
// run on it, and a Runner on it whose pool's batches log records.
func recordFirstDB(t *testing.T, target int, setup string) (*atomicphasetest.DB, *atomicphase.Runner, *batchLog) {
	t.Helper()
	log := &batchLog{}
	opts := *unmigratedDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = log }
	db := atomicphasetest.NewDB(t, &opts)
	ctx := context.Background()
	_, err := atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{TargetVersion: target, Citus: atomicphasetest.OnCitus()})
	require.NoError(t, err)
	if atomicphasetest.OnCitus() {
		// As the harness distributes it for a migrated database.
		_, err = db.Pool.Exec(ctx, `SELECT create_distributed_table('effects', 'scope', colocate_with := 'idempotency_keys')`)
		require.NoError(t, err)
	}
	if setup != "" {
		_, err = db.Pool.Exec(ctx, setup)
		require.NoError(t, err)
	}
	r, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	return db, r, log
}

// queuing is a workflow of one local phase that queues stmts and responds.
func queuing(name string, stmts ...string) *atomicphase.Workflow[struct{}] {
	return atomicphase.MustWorkflow(name, startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(_ context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			for _, s := range stmts {
				tx.Queue(s)
			}
			return atomicphase.Respond(201, []byte("ok")), nil
		}),
	}, nil)
}

// readAhead is fns after the key's read that heads a new key's batch (a
// request not marked as a retry), on one PostgreSQL (on Citus no batch
// reads its key ahead: the key is read in a round trip of its own).
func readAhead(fns ...string) []string {
	if unmarkedReadsFirst() {
		return fns
	}
	return append([]string{"read"}, fns...)
}

// A new key whose first unit goes whole (every statement queued) is
// recorded by the first statement of that unit's batch, which also takes
// the claim's lock (a plain statement named after atomicphase_record_first,
// which stands in for it on Citus): no claim of its own, so one statement
// fewer than a unit that sends before its commit, which claims first. So
// it is inside BEGIN and COMMIT: on Citus, where every unit goes so, and
// for a unit that needs a transaction block (a LOCK TABLE).
func TestANewKeyIsRecordedAtTheHeadOfItsUnit(t *testing.T) {
	t.Parallel()
	const insert = `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'only')`
	citus := atomicphasetest.OnCitus()
	// inBlock is a batch inside BEGIN and COMMIT; on Citus, every unit's.
	inBlock := func(fns ...string) []string { return append(append([]string{"begin"}, fns...), "COMMIT") }
	unit := func(fns ...string) []string {
		if citus {
			return inBlock(fns...)
		}
		return fns
	}
	for _, tc := range []struct {
		name   string
		target int // the migration the database is at; 0 for all
		stmts  []string
		want   []string
	}{
		{"all migrations", 0, []string{insert}, unit(readAhead("atomicphase_record_first", "INSERT")...)},
		{"a unit that needs a transaction block", 0, []string{`LOCK TABLE effects IN ROW EXCLUSIVE MODE`, insert},
			inBlock("atomicphase_record_first", "LOCK", "INSERT")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if citus && strings.HasPrefix(tc.stmts[0], "LOCK") {
				t.Skip("every unit is inside a transaction block on Citus: the first case")
			}
			t.Parallel()
			db, r, log := recordFirstDB(t, tc.target, "")
			ctx := context.Background()
			wf := queuing("whole", tc.stmts...)
			// The first request learns what the database offers (its
			// recording of the versions).
			_, err := r.Run(ctx, wf, postKey("first"))
			require.NoError(t, err)
			log.calls()

			resp, err := r.Run(ctx, wf, postKey("k"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			require.Equal(t, [][]string{tc.want}, log.calls(), "the new key's one batch")
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = 'u' AND idempotency_key = 'k' AND response_status = 201`).Scan(&n))
			require.Equal(t, 1, n, "the key is recorded, finished")

			// A retry is a replay; the unit's write happened once.
			resp, err = r.Run(ctx, wf, postKey("k"))
			require.NoError(t, err)
			require.True(t, resp.Replayed)
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
			require.Equal(t, 2, n, "the unit's write, once per new key (two keys)")
		})
	}
}

// Duplicates of a new key recorded at the head of its unit are refused at
// once (409), as the claim refuses them, while the first request's unit
// still runs: its batch waits on a row the test holds, after the key's
// insert took the claim's lock. They do not wait on the uncommitted key.
func TestDuplicatesOfAKeyRecordedAtTheHeadOfItsUnitAreRefusedAtOnce(t *testing.T) {
	t.Parallel()
	db, r, log := recordFirstDB(t, 0, "")
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('lock', 'k', 'held')`)
	require.NoError(t, err)
	wf := queuing("whole", `UPDATE effects SET note = 'first' WHERE scope = 'lock'`)
	_, err = r.Run(ctx, wf, postKey("warm")) // learns what the database offers
	require.NoError(t, err)
	log.units()

	hold, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	_, err = hold.Exec(ctx, `SELECT FROM effects WHERE scope = 'lock' FOR UPDATE`)
	require.NoError(t, err)
	first := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, wf, postKey("k"))
		first <- err
	}()
	// The first request's batch waits on the row the test holds (on
	// Citus, on the worker of the row's shard: citus_lock_waits sees
	// every node's waits).
	var holdPID int
	require.NoError(t, hold.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holdPID))
	waits := `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`
	if atomicphasetest.OnCitus() {
		waits = `SELECT $1::int IS NOT NULL AND EXISTS (SELECT FROM citus_lock_waits)`
	}
	require.Eventually(t, func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, waits, holdPID).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 10*time.Millisecond)

	dups := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := r.Run(ctx, wf, postKey("k"))
			dups <- err
		}()
	}
	for range 3 {
		select {
		case err := <-dups:
			var ip *atomicphase.InProgressError
			require.ErrorAs(t, err, &ip, "a duplicate of a key being recorded is in progress")
		case <-time.After(30 * time.Second):
			t.Fatal("a duplicate waited on the first request's transaction")
		}
	}
	select {
	case err := <-first:
		t.Fatalf("the first request returned while its unit waited: %v", err)
	default:
	}
	require.NoError(t, hold.Rollback(ctx))
	require.NoError(t, <-first)
	for _, b := range log.units()[:1] {
		require.Equal(t, readAhead("atomicphase_record_first", "UPDATE"), b, "the first request's unit recorded its key at its head")
	}
	var notes int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE scope = 'lock' AND note = 'first'`).Scan(&notes))
	require.Equal(t, 1, notes)
	resp, err := r.Run(ctx, wf, postKey("k"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
}

// A Runner that learnt migration 019 is applied and then meets a database
// without it (a pool of an older schema behind a Router, 020 rolled back)
// takes the key on its own, as one recorded meanwhile, and runs the
// request: nothing of the failed batch ran, and the key is not parked.
// Its next new keys are claimed first. So it is whether the batch went
// implicitly or inside BEGIN (a unit that needs a transaction block; on
// Citus every unit), and whether the failure came with the function's own
// result or, on fresh connections in the exec modes that prepare or
// describe a batch's statements first, with BEGIN's.
func TestARecordingWithoutItsFunctionTakesTheKeyOnItsOwn(t *testing.T) {
	if !atomicphasetest.OnCitus() {
		t.Skip("on one PostgreSQL a key's recording is a plain statement: no function of it can be missing")
	}
	t.Parallel()
	const insert = `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'only')`
	for _, tc := range []struct {
		name  string
		stmts []string
		fresh bool // the pool's connections replaced after the drop
	}{
		{"its statement prepared", []string{insert}, false},
		{"on fresh connections", []string{insert}, true},
		{"inside BEGIN, its statement prepared", []string{`LOCK TABLE effects IN ROW EXCLUSIVE MODE`, insert}, false},
		{"inside BEGIN, on fresh connections", []string{`LOCK TABLE effects IN ROW EXCLUSIVE MODE`, insert}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if atomicphasetest.OnCitus() && strings.HasPrefix(tc.stmts[0], "LOCK") {
				t.Skip("every unit is inside a transaction block on Citus: the cases without LOCK")
			}
			t.Parallel()
			db, r, log := recordFirstDB(t, 0, "")
			ctx := context.Background()
			wf := queuing("whole", tc.stmts...)
			_, err := r.Run(ctx, wf, postKey("warm")) // learns that migration 019 is applied
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `DROP FUNCTION atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)`)
			require.NoError(t, err)
			if tc.fresh {
				db.Pool.Reset()
			}
			log.units()

			resp, err := r.Run(ctx, wf, postKey("k"))
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			// The unit went with the key's insert at its head (after
			// BEGIN, if any), and failed (in the exec modes that describe
			// a batch first, before any statement ran).
			if calls := log.units(); len(calls) > 0 && len(calls[0]) > 0 {
				head := calls[0]
				if head[0] == "begin" {
					head = head[1:]
				}
				require.Equal(t, "atomicphase_record_first", head[0])
			}
			info, err := r.Inspect(ctx, "u", "k")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyFinished, info.Status)
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE scope = 'u'`).Scan(&n))
			require.Equal(t, 2, n, "the unit's write once per key ('warm' and 'k')")

			_, err = r.Run(ctx, wf, postKey("k2"))
			require.NoError(t, err)
			calls := log.units()
			require.Len(t, calls, 1)
			require.Contains(t, calls[0], "atomicphase_claim", "the next new key is claimed first")
		})
	}
}

// A key recorded at the head of its unit commits with the unit or not at
// all: a statement of the unit that fails after the insert (the data
// refused: 422, stored on its own), a serialization failure (the unit is
// retried, and records the key at its head again), and a connection that
// dies after the insert leave no write of the unit behind; the request, or
// its retry, writes once.
func TestARecordingAtTheHeadOfItsUnitCommitsWithIt(t *testing.T) {
	t.Parallel()
	const effect = `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'head')`
	for _, tc := range []struct {
		name, setup, then string
		status            int  // the answer, once it comes
		lost              bool // the first try fails; its retry answers
		effects           int
	}{
		{"a statement fails", "", `SELECT 1/0`, 422, false, 0},
		{"a serialization failure", `CREATE SEQUENCE flaky; CREATE FUNCTION flaky() RETURNS int LANGUAGE plpgsql AS $$
			BEGIN IF nextval('flaky') = 1 THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; RETURN 1; END $$`,
			`SELECT flaky()`, 201, false, 1},
		{"the connection dies", `CREATE SEQUENCE killed; CREATE FUNCTION kill_once() RETURNS int LANGUAGE plpgsql AS $$
			BEGIN IF nextval('killed') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN 1; END $$`,
			`SELECT kill_once()`, 201, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, r, log := recordFirstDB(t, 0, tc.setup)
			ctx := context.Background()
			effects := func() int {
				var n int
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE phase = 'head'`).Scan(&n))
				return n
			}
			_, err := r.Run(ctx, queuing("warm"), postKey("warm")) // learns that migration 019 is applied
			require.NoError(t, err)
			log.units()
			wf := queuing("head", effect, tc.then)
			resp, err := r.Run(ctx, wf, postKey("k"))
			require.Equal(t, readAhead("atomicphase_record_first"), log.units()[0][:len(readAhead("atomicphase_record_first"))], "the key's insert headed the unit")
			if tc.lost {
				require.Error(t, err)
				require.Zero(t, effects(), "nothing of the unit committed")
				// The killed backend holds the claim's advisory lock until
				// it has exited, which may be after its client saw the
				// connection close (a retry meanwhile is told the key is
				// being recorded: 409). The failed attempt's lock and
				// backoff (if the key was recorded, to keep the error) are
				// over: the retry is due.
				require.Eventually(t, func() bool { return !claimHeld(t, db, "u", "k") }, time.Minute, 10*time.Millisecond,
					"the killed backend's advisory lock is released")
				require.NoError(t, atomicphasetest.AgeLocks(ctx, db.Pool, time.Hour))
				require.NoError(t, keystore.AgeBackoffs(ctx, db.Pool, ""))
				resp, err = r.Run(ctx, wf, postKey("k"))
			}
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.Status)
			require.Equal(t, tc.effects, effects(), "the unit's write, once, or not at all")
			resp, err = r.Run(ctx, wf, postKey("k"))
			require.NoError(t, err)
			require.True(t, resp.Replayed)
			require.Equal(t, tc.status, resp.Status)
			require.Equal(t, tc.effects, effects())
		})
	}
}

// A Runner started on a schema before migration 019 claims first; once
// 019 is applied it records keys at the head of their units from its next
// recording of its versions (each sweep does one).
func TestARunnerRecordsAtTheHeadOnceMigration019IsApplied(t *testing.T) {
	if !atomicphasetest.OnCitus() {
		t.Skip("on one PostgreSQL a key's recording is a plain statement: no function of it can be missing")
	}
	t.Parallel()
	db, r, log := recordFirstDB(t, 18, "")
	ctx := context.Background()
	wf := queuing("later", `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'later')`)
	_, err := r.Run(ctx, wf, postKey("a"))
	require.NoError(t, err)
	require.Equal(t, [][]string{{"atomicphase_claim", "INSERT", "atomicphase_record_unit"}}, log.units())
	_, err = atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{Citus: atomicphasetest.OnCitus()})
	require.NoError(t, err)
	require.NoError(t, r.RecordVersions(ctx))
	log.units()
	_, err = r.Run(ctx, wf, postKey("b"))
	require.NoError(t, err)
	require.Equal(t, [][]string{{"atomicphase_record_first", "INSERT"}}, log.units())
}

// A key another request recorded, and finished, after this request read
// it and before its unit: the insert heading the unit finds it, so none
// of the unit's statements runs, and the request is answered as a replay.
// (The request is marked as a retry, so that its key is read in a round
// trip of its own, before its start function runs: unmarked, the read
// heads the unit's batch, and would find the key itself.)
func TestAKeyRecordedMeanwhileStopsTheUnitAtItsHead(t *testing.T) {
	t.Parallel()
	db, r, log := recordFirstDB(t, 0, "")
	ctx := context.Background()
	_, err := r.Run(ctx, queuing("warm"), postKey("warm")) // learns that migration 019 is applied
	require.NoError(t, err)
	var inner atomic.Bool
	var wf *atomicphase.Workflow[struct{}]
	wf = atomicphase.MustWorkflow("meanwhile", func(struct{}, *atomicphase.Request) (struct{}, error) {
		// Run once the key was read (a new key's initial state is built
		// after its read): the other request records and finishes it.
		if inner.CompareAndSwap(false, true) {
			if _, err := r.Run(ctx, wf, postKey("k")); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}, []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(_ context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'meanwhile')`)
			return atomicphase.Respond(201, []byte("ok")), nil
		}),
	}, nil)
	log.units()
	resp, err := r.Run(ctx, wf, asRetry(postKey("k")))
	require.NoError(t, err)
	require.True(t, resp.Replayed, "answered with the other request's response")
	var heads int
	for _, b := range log.units() {
		if len(b) > 0 && b[0] == "read" {
			b = b[1:]
		}
		if len(b) > 0 && b[0] == "atomicphase_record_first" {
			heads++
		}
	}
	require.Equal(t, 2, heads, "both requests' units went with the key's insert at their head")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE phase = 'meanwhile'`).Scan(&n))
	require.Equal(t, 1, n, "the unit's write, once")
}

// On Citus a Runner records a new key at the head of its first unit only
// once atomicphase_record_first is distributed with force_delegation (as
// Migrate distributes it): run on the coordinator, the function would
// take the claim's advisory lock where a previous release's claim, which
// runs on the key's worker, never looks, and a duplicate in flight would
// no longer be refused at once. Without it, the unit claims first.
func TestOnCitusARecordingAtTheHeadNeedsItsFunctionDelegated(t *testing.T) {
	if !atomicphasetest.OnCitus() {
		t.Skip("a Citus matter: run with " + atomicphasetest.CitusURLEnv)
	}
	t.Parallel()
	db, _, log := recordFirstDB(t, 0, "")
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `SELECT create_distributed_function('atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)',
		'p_scope', colocate_with := 'idempotency_keys', force_delegation := false)`)
	require.NoError(t, err)
	r, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	wf := queuing("whole", `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'only')`)
	_, err = r.Run(ctx, wf, postKey("warm")) // learns what the database offers
	require.NoError(t, err)
	log.units()
	_, err = r.Run(ctx, wf, postKey("k"))
	require.NoError(t, err)
	require.Equal(t, [][]string{{"atomicphase_claim", "INSERT", "atomicphase_record_unit"}}, log.units(),
		"a function Citus does not delegate: the unit claims first")
}

// A unit whose own statement calls a function that does not exist, one
// whose name merely contains atomicphase_record_first, fails with that
// error, and is not taken for a database without migration 019: the
// Runner's next new keys are still recorded at the head of their units.
// (In the exec modes that prepare or describe a batch first, the error
// comes before any statement runs, where a missing atomicphase_record_first's
// would.)
func TestAUnitsOwnMissingFunctionIsNotTheRecordingsMissing(t *testing.T) {
	if !atomicphasetest.OnCitus() {
		t.Skip("on one PostgreSQL a key's recording is a plain statement: no function of it can be missing")
	}
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stmts []string
	}{
		{"implicitly", nil},
		{"inside BEGIN", []string{`LOCK TABLE effects IN ROW EXCLUSIVE MODE`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if atomicphasetest.OnCitus() && tc.stmts != nil {
				t.Skip("every unit is inside a transaction block on Citus: the first case")
			}
			t.Parallel()
			_, r, log := recordFirstDB(t, 0, "")
			ctx := context.Background()
			good := queuing("good", `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'good')`)
			_, err := r.Run(ctx, good, postKey("warm")) // learns that migration 019 is applied
			require.NoError(t, err)
			bad := queuing("bad", append(tc.stmts, `SELECT my_atomicphase_record_first_audit(1)`)...)
			_, err = r.Run(ctx, bad, postKey("bad"))
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "42883", pgErr.Code, "the unit's own error")
			require.NotErrorIs(t, err, keystore.ErrRecordFirstMissing)
			log.units()
			_, err = r.Run(ctx, good, postKey("next"))
			require.NoError(t, err)
			calls := log.units()
			require.Len(t, calls, 1)
			require.Contains(t, calls[0], "atomicphase_record_first", "the next new key is still recorded at the head of its unit")
		})
	}
}
