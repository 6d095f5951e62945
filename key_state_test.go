package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The model-based test of the key's life: random sequences of client
// requests (each with a fault drawn for it: a crash before or after the
// payout call or before a commit, a database connection that breaks
// before a commit, an answer the bank loses, a bank that refuses, a bug
// that fails the last phase for good, its lookups down), resumes, sweeps,
// concurrent takes (two or three of a client's retry, a resume and a sweep
// at once), operator actions (unpark, verdict, forget, the reaps) and time
// passing, against a real database. After every step the key's status is
// read back, and the step must be one the transition table (key_state.go)
// allows (for concurrent takes, a chain of the takes' transitions); no
// operation may meet the database's refusal of a change the table does not
// allow; a delete must only ever remove a key that was finished or parked
// and settled; and at the end the bank must hold at most one payout
// reference, paid at most once, for the one client key. The key's history
// must tell the same story, step by step, each event a change the table
// allows.

// modelFaults are a step's faults, drawn per step.
type modelFaults struct {
	crashAt   atomic.Value // "" or "phase/place"
	permanent atomic.Bool  // the last phase fails for good
	transient atomic.Bool  // the first phase fails, for now (TestUpgradeCarriesKeysInEveryState)
}

func (f *modelFaults) set(crashAt string, permanent bool) {
	f.crashAt.Store(crashAt)
	f.permanent.Store(permanent)
}

// modelWorkflow: prepare (local), pay (foreign, through the bank, with a
// reconcile function), done (local, responds), each phase committing on
// its own.
func modelWorkflow(bk *bank, f *modelFaults) *atomicphase.Workflow[payout] {
	return modelWorkflowOf(bk, f, &atomicphase.WorkflowOpts{CommitEachPhase: true})
}

// modelWorkflowOf is modelWorkflow with opts: nil fuses a new key's
// recording with prepare, in one unit whose batch the key's insert heads
// (atomicphase_record_first).
func modelWorkflowOf(bk *bank, f *modelFaults, opts *atomicphase.WorkflowOpts) *atomicphase.Workflow[payout] {
	return atomicphase.MustWorkflow("model", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			if f.transient.Load() {
				return atomicphase.Outcome{}, errors.New("a passing fault in prepare")
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				id, err := bk.pay(ctx, ref)
				p.PayoutID = id
				return err
			})
		}, nil).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			ids, err := bk.lookup(call.Key())
			if err != nil || len(ids) == 0 {
				return false, err
			}
			p.PayoutID = ids[0]
			return true, nil
		}),
		atomicphase.Local("done", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			if f.permanent.Load() {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("a bug in done"))
			}
			return atomicphase.Respond(201, []byte("paid")), nil
		}),
	}, opts)
}

func TestKeyStatesFollowTheTable(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 24; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runKeyModel(t, seed, 40, &atomicphase.WorkflowOpts{CommitEachPhase: true})
		})
	}
	// The same with a new key recorded in prepare's unit: on one
	// PostgreSQL, by the insert heading that unit's batch.
	for seed := uint64(101); seed <= 112; seed++ {
		t.Run(fmt.Sprintf("fused/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runKeyModel(t, seed, 40, nil)
		})
	}
}

func runKeyModel(t *testing.T, seed uint64, steps int, opts *atomicphase.WorkflowOpts) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var faults modelFaults
	faults.set("", false)
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 3,
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
			c, _ := faults.crashAt.Load().(string)
			switch {
			case c != "" && c == at.Phase+"/"+string(at.Place):
				faults.crashAt.Store("") // one crash per step
				return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
			case conn != nil && c == "close:"+at.Phase+"/"+string(at.Place):
				// The connection breaks under the attempt, which finds
				// out when it next sends on it: its commit.
				faults.crashAt.Store("")
				_ = conn.PgConn().Conn().Close()
			}
			return nil
		})})
	bk := newBank()
	wf := modelWorkflowOf(bk, &faults, opts)
	require.NoError(t, b.runner.Register(wf))
	// The sweep's own reaps are left to the reap steps (a sweep that
	// finished a key and reaped it at once would show as one step).
	sweeper := newSweeper(t, b, &atomicphase.SweepConfig{Retention: 24 * time.Hour, ParkedRetention: -1})

	// The key's stored state, and what Inspect makes of it, which must be
	// one of the statuses of that state.
	status := func() (atomicphase.KeyState, *atomicphase.KeyInfo) {
		info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
		if errors.Is(err, atomicphase.ErrKeyNotFound) {
			return atomicphase.KeyAbsent, nil
		}
		require.NoError(t, err)
		var state atomicphase.KeyState
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT `+storedState+` FROM idempotency_keys WHERE scope = 'driver_1' AND idempotency_key = 'k'`).Scan(&state))
		require.Contains(t, atomicphase.KeyStatusesIn[state], info.Status, "a %s key shows as %s", state, info.Status)
		return state, info
	}
	crashes := []string{"", "", "", "pay/" + string(atomicphase.BeforePhase), "pay/" + string(atomicphase.AfterForeign),
		"done/" + string(atomicphase.BeforeCommit), "prepare/" + string(atomicphase.AfterCommit),
		"close:prepare/" + string(atomicphase.BeforeCommit), "close:pay/" + string(atomicphase.BeforeCommit),
		"close:done/" + string(atomicphase.BeforeCommit)}
	bankFaults := []string{"", "", "act-then-lose", "refuse-5xx"}
	ops := []atomicphase.KeyOp{"run", "run", "run", "resume", "sweep", "race", "time", "unpark", "verdict", "forget", "reap-parked", "reap"}
	// A step's operations' errors: none may be the database's refusal of
	// a change of state (AP010) or of a delete (AP011), which only a write
	// outside the table meets.
	var errs []error
	noRefusal := func(i int, op atomicphase.KeyOp, trace []string) {
		for _, err := range errs {
			require.NotContains(t, []string{"AP010", "AP011"}, sqlState(err),
				"step %d (%s): the database refused a change: %v; trace:\n%v", i, op, err, trace)
		}
		errs = errs[:0]
	}
	var trace []string
	lives := 1 // a finished key deleted (forgotten, reaped) lets the next request pay anew
	from, info := status()
	historySeen := 0 // events of the key's history already read
	changes := atomicphase.KeyStateChanges()
	// take is a client's retry, a Resume or a sweep: the takes.
	take := func(which atomicphase.KeyOp) error {
		var err error
		switch which {
		case "run":
			_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
		case "resume":
			_, err = b.runner.Resume(b.ctx, "driver_1", "k")
		case "sweep":
			_, err = sweeper.RunOnce(b.ctx)
		}
		return err
	}
	for i := 0; i < steps; i++ {
		op := ops[rng.IntN(len(ops))]
		faults.set(crashes[rng.IntN(len(crashes))], rng.IntN(6) == 0)
		bk.mu.Lock()
		bk.fail = []string{bankFaults[rng.IntN(len(bankFaults))]}
		bk.mu.Unlock()
		bk.lookupDown.Store(int32(rng.IntN(2)))
		switch op {
		case "run", "resume", "sweep":
			errs = append(errs, take(op))
		case "race":
			racers := make([]atomicphase.KeyOp, 2+rng.IntN(2))
			for j := range racers {
				racers[j] = []atomicphase.KeyOp{"run", "run", "resume", "sweep"}[rng.IntN(4)]
			}
			// A payout call waits until every other racer has returned
			// or is paying too: a racer that takes the key while another
			// one's call is out, and pays again, is then sure to be seen.
			var mu sync.Mutex
			settled, released := 0, make(chan struct{})
			settle := func() {
				mu.Lock()
				if settled++; settled == len(racers) {
					close(released)
				}
				mu.Unlock()
			}
			bk.gate = func() {
				settle()
				<-released
			}
			raced := make([]error, len(racers))
			var wg sync.WaitGroup
			for j, which := range racers {
				wg.Go(func() {
					raced[j] = take(which)
					settle()
				})
			}
			wg.Wait()
			bk.gate = nil
			errs = append(errs, raced...)
		case "time":
			if rng.IntN(2) == 0 {
				require.NoError(t, atomicphasetest.AgeLocks(b.ctx, b.db.Pool, time.Hour))
				require.NoError(t, keystore.AgeBackoffs(b.ctx, b.db.Pool, ""))
			} else {
				// An hour passes for every time stored, the sweep's
				// watermark included, and nothing is marked: a key that
				// never went wrong is for the watermark to find.
				shiftTimes(t, b, time.Hour, true)
			}
		case "unpark":
			errs = append(errs, b.runner.Unpark(b.ctx, "driver_1", "k"))
		case "verdict":
			// The operator asks the bank, and records what it says.
			if info != nil {
				bk.mu.Lock()
				happened := len(bk.payouts[info.DownstreamKeys["pay"]]) > 0
				bk.mu.Unlock()
				errs = append(errs, b.runner.RecordResolution(b.ctx, "driver_1", "k", happened, "model"))
			}
		case "forget":
			errs = append(errs, b.runner.Forget(b.ctx, "driver_1", "k"))
		case "reap-parked":
			_, err := b.runner.ReapParked(b.ctx, 0, 10)
			require.NoError(t, err)
		case "reap":
			_, err := b.runner.Reap(b.ctx, 0, 10, 1)
			require.NoError(t, err)
		}
		to, next := status()
		// Every unfinished key is in the console's reading of them (the
		// keys that went wrong, the parked, those since the watermark).
		var unfinished int64
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL`).Scan(&unfinished))
		levels, err := b.runner.KeyLevels(b.ctx, nil)
		require.NoError(t, err)
		var seen int64
		for _, l := range levels {
			seen += l.Count
		}
		require.Equal(t, unfinished, seen, "step %d (%s): the levels count every unfinished key; trace:\n%v", i, op, trace)
		trace = append(trace, fmt.Sprintf("%s: %s -> %s", op, from, to))
		noRefusal(i, op, trace)
		if op == "race" {
			require.True(t, reachable(from, to, "run", "resume", "sweep"),
				"step %d (%s) moved the key %s -> %s, which no chain of takes the table allows makes; trace:\n%v", i, op, from, to, trace)
		} else {
			require.True(t, atomicphase.KeyTransitionAllowed(op, from, to),
				"step %d (%s) moved the key %s -> %s, which the table does not allow; trace:\n%v", i, op, from, to, trace)
		}
		if to == atomicphase.KeyAbsent && from != atomicphase.KeyAbsent {
			require.True(t, atomicphase.KeyDeletable(from, info.Unsettled),
				"step %d (%s) deleted a key that was %s, unsettled=%v; trace:\n%v", i, op, from, info.Unsettled, trace)
			if from != "finished" {
				// The bank's word, not the library's: a deleted key that
				// had not finished must not have paid.
				bk.mu.Lock()
				paid := bk.payouts[info.DownstreamKeys["pay"]]
				bk.mu.Unlock()
				require.Empty(t, paid, "step %d (%s) deleted a %s key that had paid; trace:\n%v", i, op, from, trace)
			}
			lives++
		}
		// The history tells the same story: the events this step added
		// lead, state by state, from where the key was to where it is
		// (a new key's begins running; a deleted key's is gone with it).
		hist := events(t, b, "k")
		if to == atomicphase.KeyAbsent {
			require.Empty(t, hist, "step %d (%s): a deleted key's history goes with it", i, op)
		} else if added := hist[min(historySeen, len(hist)):]; len(added) > 0 {
			at := string(from)
			if from == atomicphase.KeyAbsent || len(hist) < historySeen {
				at = "running"
			}
			for _, e := range added {
				require.Equal(t, at, e[1], "step %d (%s): %v follows %s; trace:\n%v", i, op, e, at, trace)
				require.True(t, e[1] == e[2] || changes[[2]atomicphase.KeyState{atomicphase.KeyState(e[1]), atomicphase.KeyState(e[2])}],
					"step %d (%s): the history records %v, a change the table does not allow; trace:\n%v", i, op, e, trace)
				at = e[2]
			}
			require.Equal(t, string(to), at, "step %d (%s): the history ends where the key is: %v; trace:\n%v", i, op, added, trace)
		} else if from != to {
			// Only the happy path is silent: recorded, running, finished.
			require.Contains(t, []atomicphase.KeyState{atomicphase.KeyAbsent, "running"}, from,
				"step %d (%s): a key that left %s has an event for it; trace:\n%v", i, op, from, trace)
			require.Contains(t, []atomicphase.KeyState{"running", "finished"}, to,
				"step %d (%s): a key that became %s has an event for it; trace:\n%v", i, op, to, trace)
		}
		historySeen = len(hist)
		from, info = to, next
	}
	bk.mu.Lock()
	defer bk.mu.Unlock()
	require.LessOrEqual(t, len(bk.payouts), lives, "at most one payout reference per life of the client key: %v; trace:\n%v", bk.payouts, trace)
	for ref, ids := range bk.payouts {
		require.Len(t, ids, 1, "paid once under %s; trace:\n%v", ref, trace)
	}
}

// reachable reports whether a chain of transitions of ops, one after
// another, the table allows may move a key from state from to state to:
// what concurrent operations may make of a key between two readings.
func reachable(from, to atomicphase.KeyState, ops ...atomicphase.KeyOp) bool {
	seen := map[atomicphase.KeyState]bool{from: true}
	queue := []atomicphase.KeyState{from}
	all := append([]atomicphase.KeyState{atomicphase.KeyAbsent}, atomicphase.KeyStates...)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, op := range ops {
			for _, next := range all {
				if !seen[next] && atomicphase.KeyTransitionAllowed(op, s, next) {
					seen[next] = true
					queue = append(queue, next)
				}
			}
		}
	}
	return seen[to]
}

// shiftTimes moves every time the key table (and, withWatermark, the
// sweep's watermark) keeps back by d: the passage of d, for every clock
// reading at once. (Shifted in
// UTC with immutable operators, as atomicphasetest.AgeLocks does.)
func shiftTimes(t *testing.T, b *testBundle, d time.Duration, withWatermark bool) {
	t.Helper()
	var set []string
	for _, col := range []string{"created_at", "updated_at", "locked_at", "call_until", "next_attempt_at", "parked_at",
		"final_parked_at", "unknown_at", "called_at", "finished_at", "resolved_at"} {
		set = append(set, fmt.Sprintf("%[1]s = (%[1]s AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC'", col))
	}
	_, err := b.db.Pool.Exec(b.ctx, "UPDATE idempotency_keys SET "+strings.Join(set, ", "), d.Microseconds())
	require.NoError(t, err)
	if !withWatermark {
		return
	}
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE atomicphase_sweep_watermark
		SET created_before = (created_before AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC',
		    pending_before = (pending_before AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC'`, d.Microseconds())
	require.NoError(t, err)
}

// storedState is a key's stored state, by its name.
const storedState = `atomicphase_state_name(status)`

// sqlState is the SQLSTATE of err, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// stateColumns puts a row in state $2, its status and the columns that
// are that state's data, leaving it settled; $3 is a time (Citus evaluates
// no now() in a CASE).
const stateColumns = `SET status = substr($2::text, 1, 1)::"char",
    response_status = CASE WHEN $2::text = 'finished' THEN 200 END,
    recovery_point = CASE WHEN $2::text = 'finished' THEN 'finished' ELSE 'started' END,
    parked_at = CASE WHEN $2::text = 'parked' THEN $3::timestamptz END,
    locked_at = CASE WHEN $2::text = 'running' THEN $3::timestamptz END,
    unknown_at = CASE WHEN $2::text = 'unknown' THEN $3::timestamptz END,
    called_at = NULL, call_until = NULL`

// Every statement that writes a key names, in a comment on its test of
// the key's status ("from: <op>"), the operation of key_state.go's table
// it is, and the states it may move a key from are among those the table
// lets that operation move a key from: in the migrations' functions and
// in the key store's statements alike. And the database holds every
// DELETE to the table: it removes only a key that keyDeletable allows,
// unless a forced forget is on the audit trail or the transaction says it
// is one.
func TestKeyStateTableIsTheDatabases(t *testing.T) {
	t.Parallel()
	var sources []string
	migrations, err := atomicphase.Migrations(nil)
	require.NoError(t, err)
	for _, m := range migrations {
		sources = append(sources, m.Up)
	}
	goFiles, err := filepath.Glob(filepath.Join("internal", "keystore", "*.go"))
	require.NoError(t, err)
	for _, f := range goFiles {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		sources = append(sources, string(b))
	}
	names := map[byte]atomicphase.KeyState{'r': "running", 'w': "waiting", 'u': "unknown", 'p': "parked", 'f': "finished"}
	mark := regexp.MustCompile(`(?:'\{([rwupf,]+)\}'::"char"\[\]\)?|= '([rwupf])')\s*/\* from: ([a-z-]+) \*/`)
	seen := map[atomicphase.KeyOp]bool{}
	for _, src := range sources {
		for _, m := range mark.FindAllStringSubmatch(src, -1) {
			op := atomicphase.KeyOp(m[3])
			from, ok := atomicphase.KeyTransitions[op]
			require.True(t, ok, "%q names no operation of the table", m[0])
			seen[op] = true
			for _, c := range strings.Split(m[1]+m[2], ",") {
				state := names[c[0]]
				_, allowed := from[state]
				require.True(t, allowed, "%q lets %s move a %s key, which the table does not", m[0], op, state)
			}
		}
	}
	for _, op := range []atomicphase.KeyOp{"run", "resume", "sweep", "unpark", "verdict", "due"} {
		require.True(t, seen[op], "no statement names %s", op)
	}

	b := setup(t, nil)
	n := 0
	newKey := func(s atomicphase.KeyState) string {
		n++
		key := fmt.Sprintf("k%d", n)
		_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, status)
			VALUES ('s', $1, 'w', '\x00', 'POST', '/', '\x00', 'w')`, key)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys `+stateColumns+` WHERE scope = 's' AND idempotency_key = $1`, key, s, time.Now())
		require.NoError(t, err, "a new key may become %s", s)
		return key
	}

	// Deletes, of a settled key and of one that may have paid.
	del := func(key string) error {
		_, err := b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE scope = 's' AND idempotency_key = $1`, key)
		return err
	}
	for _, s := range atomicphase.KeyStates {
		for _, unsettled := range []bool{false, true} {
			key := newKey(s)
			if unsettled {
				_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET called_at = $2 WHERE scope = 's' AND idempotency_key = $1`, key, time.Now())
				require.NoError(t, err)
			}
			err := del(key)
			if atomicphase.KeyDeletable(s, unsettled) {
				require.NoError(t, err, "%s, unsettled=%v", s, unsettled)
				continue
			}
			require.Equal(t, "AP011", sqlState(err), "%s, unsettled=%v: %v", s, unsettled, err)
			// A forced forget of a parked key on the audit trail lets it
			// go (what ForgetForced, of this release and the previous
			// one, writes first), where the trail is on the key's node;
			// one of the key in another state, or of an earlier park, does
			// not (a ForgetForced refused leaves its entry behind). A
			// transaction that says it is a forced forget lets any go.
			if unsettled {
				require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: key, Actor: "alice", Action: "forget", Note: "checked",
					Detail: []byte(`{"forced": true, "status_before": "` + string(s) + `"}`)}))
				if s == "parked" && !atomicphasetest.OnCitus() {
					_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = now() WHERE scope = 's' AND idempotency_key = $1`, key)
					require.NoError(t, err)
					require.Equal(t, "AP011", sqlState(del(key)), "an entry of an earlier park")
					require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: key, Actor: "alice", Action: "forget", Note: "checked",
						Detail: []byte(`{"forced": true, "status_before": "parked"}`)}))
				}
				if s == "parked" && !atomicphasetest.OnCitus() { // where the trail is not on the key's node
					require.NoError(t, del(key))
					continue
				}
				require.Equal(t, "AP011", sqlState(del(key)), "%s: the trail's entry is not for this", s)
			}
			require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
				// As ForgetForced says it (Citus sends the setting to the
				// worker that holds the key).
				for _, set := range []string{`SET LOCAL citus.propagate_set_commands = 'local'`, `SET LOCAL atomicphase.forget_forced = 'on'`} {
					if _, err := tx.Exec(b.ctx, set); err != nil {
						return err
					}
				}
				_, err := tx.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE scope = 's' AND idempotency_key = $1`, key)
				return err
			}))
		}
	}
}

// A DELETE written by hand (an operator's clean-up, a script of the
// previous release's era) of a key whose payout's outcome is unknown is
// refused: the client's retry would record the key anew, with a new salt,
// and the bank would pay twice. The audit trail's forced forget deletes
// it.
func TestHandWrittenDeleteOfAKeyThatMayHavePaidIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
	bk := newBank()
	wf := payoutWorkflow(bk)
	parkUnknown(t, b, bk, wf, "p")
	_, err := b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE created_at < now() + interval '1 day'`)
	require.Equal(t, "AP011", sqlState(err), "%v", err)
	info, err := b.runner.Inspect(b.ctx, "driver_1", "p")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.NoError(t, b.runner.ForgetForced(b.ctx, "driver_1", "p", "alice", "bank confirmed payout po_1 by phone"))
	_, err = b.runner.Inspect(b.ctx, "driver_1", "p")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)
}
