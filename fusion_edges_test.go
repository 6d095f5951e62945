package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
)

// rewindState is the state of rewindWorkflow.
type rewindState struct {
	ChargeID string `json:"charge_id"`
	ShipID   string `json:"ship_id"`
}

// rewindWorkflow is prepare (local) → charge (foreign, whose record step
// writes) → ledger (local, fused with charge's record step) → ship
// (foreign) → finish (local, responds). Every local body writes one effects
// row named after its phase.
func rewindWorkflow(t *testing.T, calls *atomic.Int32) *atomicphase.Workflow[rewindState] {
	t.Helper()
	write := func(name string) atomicphase.LocalFunc[rewindState] {
		return func(ctx context.Context, tx atomicphase.Tx, s *rewindState) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', $1, $2)`, name, s.ChargeID)
			if name == "finish" {
				return atomicphase.Respond(201, []byte(s.ChargeID+"/"+s.ShipID)), nil
			}
			return atomicphase.Continue(), nil
		}
	}
	wf, err := atomicphase.NewWorkflow("rewind", startEmpty[rewindState], []atomicphase.Phase[rewindState]{
		atomicphase.Local("prepare", write("prepare")),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *rewindState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				calls.Add(1)
				s.ChargeID = "ch_" + key[:8]
				return nil
			})
		}, write("charge")),
		atomicphase.Local("ledger", write("ledger")),
		atomicphase.Foreign("ship", func(ctx context.Context, call *atomicphase.ForeignCall, s *rewindState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				s.ShipID = "sh_" + key[:8]
				return nil
			})
		}, nil),
		atomicphase.Local("finish", write("finish")),
	}, nil)
	require.NoError(t, err)
	return wf
}

// When the commit of a unit that began with a foreign phase's record step
// reaches the server but its acknowledgement is lost, failUnit commits the
// record step "on its own" a second time: the key's recovery point is
// moved back from the unit's last phase to the foreign phase, the record
// step's writes are committed twice, and the retry runs the fused local
// phase again. Every local phase's writes must commit exactly once.
func TestReviewLostAckOfAFusedUnitDoesNotRewindTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rule faultinject.Rule
	}{
		{"lose-commit-ack", faultinject.Rule{Phase: "ledger", Place: atomicphase.BeforeCommit, Action: faultinject.LoseCommitAck}},
		{"error-after-commit", faultinject.Rule{Phase: "ledger", Place: atomicphase.AfterCommit, Action: faultinject.Error}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := *testDBOpts
			opts.PoolConfig = func(cfg *pgxpool.Config) { faultinject.InstallDialer(cfg.ConnConfig) }
			db := atomicphasetest.NewDB(t, &opts)
			runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: faultinject.New(tc.rule)})
			require.NoError(t, err)
			b := &testBundle{db: db, runner: runner, ctx: context.Background()}
			var calls atomic.Int32
			wf := rewindWorkflow(t, &calls)
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"}

			_, err = runner.Run(b.ctx, wf, req)
			require.Error(t, err, "the attempt does not know its commit happened")
			info, err := runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			assert.Equal(t, "ledger", info.RecoveryPoint,
				"the unit charge+ledger committed; nothing may move the key back to an earlier phase")
			assert.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = 'charge'`),
				"the charge record step's writes committed once")

			ageLocks(t, b)
			resp, err := runner.Run(b.ctx, wf, req)
			require.NoError(t, err)
			require.Equal(t, 201, resp.Status)
			for _, phase := range []string{"prepare", "charge", "ledger", "finish"} {
				assert.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = $1`, phase), phase)
			}
			require.EqualValues(t, 1, calls.Load())
		})
	}
}

// holdState is the state of holdWorkflow.
type holdState struct{}

// holdWorkflow's first local phase sends a statement (so the key's recording
// is on the server, uncommitted), then runs hold; its next phase responds.
func holdWorkflow(name string, hold func(ctx context.Context) error, opts ...*atomicphase.WorkflowOpts) *atomicphase.Workflow[holdState] {
	var o *atomicphase.WorkflowOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	return atomicphase.MustWorkflow(name, startEmpty[holdState], []atomicphase.Phase[holdState]{
		atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, _ *holdState) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if err := hold(ctx); err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("done", func(context.Context, atomicphase.Tx, *holdState) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, o)
}

// MaxUnfinishedPerScope is "a defence against a caller spraying keys by the
// thousand". With phase fusion a new key is not counted until its first
// transaction commits, so keys sent one after the other (each started only
// once the one before it is running) all pass the cap while their first
// phases run: the cap bounds nothing for a workflow whose first phase
// takes time. Before fusion the key was committed by atomicphase_acquire
// before any phase ran, and the third key got ErrTooManyKeys.
func TestReviewScopeCapHoldsForNewKeysStartedOneAfterAnother(t *testing.T) {
	t.Parallel()
	t.Run("fused", func(t *testing.T) { t.Parallel(); scopeCapRun(t, nil) })
	t.Run("commit-each-phase", func(t *testing.T) {
		t.Parallel()
		scopeCapRun(t, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	})
}

func scopeCapRun(t *testing.T, wopts *atomicphase.WorkflowOpts) {
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.MaxConns = 16 } // one connection per running key
	b := setupDB(t, &opts, &atomicphase.Config{MaxUnfinishedPerScope: 2})
	entered := make(chan struct{}, 16)
	release := make(chan struct{})
	wf := holdWorkflow("capped", func(ctx context.Context) error {
		entered <- struct{}{}
		<-release
		return nil
	}, wopts)
	const n = 6
	results := make([]chan error, n)
	running, refused := 0, 0
	var ran []int
	for i := range n {
		results[i] = make(chan error, 1)
		go func() {
			_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: fmt.Sprint("k", i), Method: "POST", Path: "/c"})
			results[i] <- err
		}()
		// The next key is sent only once this one is running, or was refused.
		select {
		case <-entered:
			running++
			ran = append(ran, i)
		case err := <-results[i]:
			require.ErrorIs(t, err, atomicphase.ErrTooManyKeys)
			refused++
		}
	}
	close(release)
	for _, i := range ran {
		require.NoError(t, <-results[i])
	}
	t.Logf("%d of %d new keys ran in a scope capped at 2; %d refused", running, n, refused)
	assert.LessOrEqual(t, running, 2, "more keys ran at once than MaxUnfinishedPerScope allows")
}

// EventCreated ("a new key was recorded") is reported when the recording's
// INSERT answers, before its transaction commits. When the first unit then
// rolls back and a duplicate that was waiting on the uncommitted row
// records the key itself, the key is reported created twice
// (atomicphase.reserve.created counts 2 for one key).
func TestReviewCreatedIsReportedOncePerKey(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec})
	// Which of the two records the key after the rollback is a race; a few
	// keys make the duplicate win it at least once.
	const rounds = 8
	for i := range rounds {
		entered, release := make(chan struct{}), make(chan struct{})
		var runs atomic.Int32
		wf := holdWorkflow(fmt.Sprint("created", i), func(ctx context.Context) error {
			if runs.Add(1) == 1 {
				close(entered)
				<-release
				return errors.New("transient")
			}
			return nil
		})
		req := atomicphase.Request{Scope: "u", Key: fmt.Sprint("k", i), Method: "POST", Path: "/c"}
		first, second := make(chan error, 1), make(chan error, 1)
		go func() { _, err := b.runner.Run(b.ctx, wf, req); first <- err }()
		<-entered
		go func() { _, err := b.runner.Run(b.ctx, wf, req); second <- err }()
		// The duplicate does not wait on the uncommitted recording.
		assert.ErrorIs(t, <-second, atomicphase.ErrInProgress)
		close(release)
		<-first
	}
	created := map[string]int{}
	rec.mu.Lock()
	for _, e := range rec.events {
		if e.Kind == atomicphase.EventCreated {
			created[e.Key]++
		}
	}
	rec.mu.Unlock()
	for i := range rounds {
		key := fmt.Sprint("k", i)
		assert.Equal(t, 1, created[key], "key %s, recorded once, reported created %d times", key, created[key])
	}
}

// stressState is the state of stressWorkflow.
type stressState struct {
	Key    string `json:"key"`
	Payout string `json:"payout"`
}

// stressBank is a downstream without idempotency keys: every call it takes
// is a payout.
type stressBank struct {
	mu      sync.Mutex
	payouts map[string]int
	calls   atomic.Int32
}

func (sb *stressBank) pay(ref string) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.payouts[ref]++
}

func (sb *stressBank) paid(ref string) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.payouts[ref] > 0
}

// stressWorkflow is reserve (local) → pay (foreign, WithReconcile, its
// record step writing) → book (local, fused with pay's record step) →
// finish (local, responds), with random failures in reserve, pay and book.
func stressWorkflow(sb *stressBank, failPct int) *atomicphase.Workflow[stressState] {
	rnd := func() bool { return rand.IntN(100) < failPct }
	write := func(name string, failing bool) atomicphase.LocalFunc[stressState] {
		return func(ctx context.Context, tx atomicphase.Tx, s *stressState) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', $1, $2, $3)`, s.Key, name, s.Payout)
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if failing && rnd() {
				return atomicphase.Outcome{}, errors.New("transient " + name)
			}
			if name == "finish" {
				return atomicphase.Respond(201, []byte(s.Payout)), nil
			}
			return atomicphase.Continue(), nil
		}
	}
	start := func(_ struct{}, req *atomicphase.Request) (stressState, error) {
		return stressState{Key: req.Key}, nil
	}
	return atomicphase.MustWorkflow("stress", start, []atomicphase.Phase[stressState]{
		atomicphase.Local("reserve", write("reserve", true)),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, s *stressState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				sb.calls.Add(1)
				sb.pay(key)
				if rnd() {
					return errors.New("connection reset after sending") // took effect, answer lost
				}
				s.Payout = "po_" + key[:8]
				return nil
			})
		}, write("pay", false)).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, s *stressState) (bool, error) {
			if sb.paid(call.Key()) {
				s.Payout = "po_" + call.Key()[:8]
				return true, nil
			}
			return false, nil
		}),
		atomicphase.Local("book", write("book", true)),
		atomicphase.Local("finish", write("finish", false)),
	}, nil)
}

// Many clients retry duplicates of a few new keys at once, with random
// transient failures before, in and after a non-idempotent call: every key
// ends with one payout, every phase's writes once, and one body for all.
// (This one holds; it is kept as a regression guard for fusion's races.)
func TestReviewConcurrentDuplicatesUnderFailures(t *testing.T) {
	t.Parallel()
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.MaxConns = 24 }
	// The stress bank acts before it answers: once a call returned, nothing
	// of it is in flight, and the grace can be short.
	b := setupDB(t, &opts, &atomicphase.Config{MaxAttempts: 1000, CallGrace: time.Nanosecond})
	sb := &stressBank{payouts: map[string]int{}}
	wf := stressWorkflow(sb, 25)
	const keys, clients = 6, 8
	bodies := make([][]string, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := atomicphase.Request{Scope: "u", Key: fmt.Sprint("k", k), Method: "POST", Path: "/s"}
				for try := 0; try < 400; try++ {
					resp, err := b.runner.Run(b.ctx, wf, req)
					if err == nil {
						mu.Lock()
						bodies[k] = append(bodies[k], string(resp.Body))
						mu.Unlock()
						return
					}
					if !atomicphase.Retryable(err) && !errors.Is(err, atomicphase.ErrOutcomeUnknown) {
						t.Errorf("key %d: final error %v", k, err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				}
				t.Errorf("key %d: no final answer", k)
			}()
		}
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprint("k", k)
		for _, phase := range []string{"reserve", "pay", "book", "finish"} {
			assert.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = $1 AND phase = $2`, key, phase), "%s %s", key, phase)
		}
		for _, body := range bodies[k] {
			assert.Equal(t, bodies[k][0], body, key)
		}
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	assert.Len(t, sb.payouts, keys)
	for ref, n := range sb.payouts {
		assert.Equal(t, 1, n, "payouts under %s", ref)
	}
}

// The fault explorer over a workflow whose fused unit after a call does not
// respond (charge's record step + ledger): every point × action must end
// with each phase's writes committed once. The shop scenario the explorer
// suites use responds in that unit, so they cannot see what a lost commit
// answer (or an error after the commit) does there.
func TestReviewExplorerOverAFusedUnitThatDoesNotRespond(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	atomicphasetest.Explore(t, atomicphasetest.Scenario{
		Name: "rewind",
		DB:   testDBOpts,
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			var calls atomic.Int32
			wf := rewindWorkflow(t.(*testing.T), &calls)
			return &atomicphasetest.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"})
				},
				Check: func(ctx context.Context, _ *atomicphase.Response) error {
					for _, phase := range []string{"prepare", "charge", "ledger", "finish"} {
						var n int
						if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE phase = $1`, phase).Scan(&n); err != nil {
							return err
						}
						if n != 1 {
							return fmt.Errorf("%d %s rows, want 1", n, phase)
						}
					}
					return nil
				},
			}
		},
	})
}

// A key belongs to the request that records it. With phase fusion a
// request's first transaction records its key; a concurrent request
// reusing the key with other parameters while that transaction runs is
// told at once that the key is in progress (it waits for nothing), and its
// retry is refused as a reuse: exactly one of the two owns the key and
// runs (docs/concepts.md, Phase fusion: duplicates).
func TestReviewAFailedFirstTransactionKeepsItsKeyFromAReuse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const rounds = 6
	for i := range rounds {
		entered, release := make(chan struct{}), make(chan struct{})
		var runs atomic.Int32
		wf := holdWorkflow(fmt.Sprint("reuse", i), func(ctx context.Context) error {
			if runs.Add(1) == 1 {
				close(entered)
				<-release
				return errors.New("transient")
			}
			return nil
		})
		key := fmt.Sprint("k", i)
		orig := atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/c", Params: []byte(`{"amount": 1}`)}
		reuse := atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/c", Params: []byte(`{"amount": 999}`)}
		first, second := make(chan error, 1), make(chan error, 1)
		go func() { _, err := b.runner.Run(b.ctx, wf, orig); first <- err }()
		<-entered
		go func() { _, err := b.runner.Run(b.ctx, wf, reuse); second <- err }()
		err2 := <-second // answered while the first transaction runs: it waits for nothing
		close(release)
		err1 := <-first
		if errors.Is(err2, atomicphase.ErrInProgress) {
			// Refused before the key was visible: its retry meets the
			// key the first request recorded.
			_, err2 = b.runner.Run(b.ctx, wf, reuse)
		}
		refused := 0
		for _, err := range []error{err1, err2} {
			if errors.Is(err, atomicphase.ErrFingerprintMismatch) {
				refused++
			}
		}
		assert.Equal(t, 1, refused, "round %d: exactly one request is refused as a reuse (%v; %v)", i, err1, err2)
		if errors.Is(err1, atomicphase.ErrFingerprintMismatch) {
			assert.NoError(t, err2, "round %d: the request that owns the key runs", i)
		}
	}
}

// A panic in a phase of a fused transaction ends the spans of the phases
// that ran before it in that transaction (they rolled back with it), as an
// ordinary failure does: an Observer must see every span it was given end.
func TestReviewPanicInAFusedTransactionEndsEverySpan(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b := setup(t, &atomicphase.Config{Observer: rec})
	type st struct{}
	wf := atomicphase.MustWorkflow("panics", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("one", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'one')`)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("two", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			panic("bug in two")
		}),
	}, nil)
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"})
	}()
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	assert.Equal(t, atomicphase.KeyParked, info.Status)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.spans {
		assert.True(t, s.ended, "span %s %q never ended", s.span.Kind, s.span.Phase)
	}
}

// A duplicate speculating on a new key while the holder runs it, whose
// phase swallows the error its first statement returns (the key is being
// recorded), is refused as in progress at once, nothing it wrote survives,
// and a retry once the holder finished replays the holder's response.
func TestReviewASwallowingDuplicateOfAFinishedKeyReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	type st struct{}
	wf := atomicphase.MustWorkflow("swallow", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			n := runs.Add(1)
			_, _ = tx.Exec(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', 'only', $1)`, fmt.Sprint(n)) // error swallowed
			if n == 1 {
				close(entered)
				<-release
			}
			return atomicphase.Respond(200, []byte(fmt.Sprint("run ", n))), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/s"}
	first := make(chan *atomicphase.Response, 1)
	go func() { r, err := b.runner.Run(b.ctx, wf, req); assert.NoError(t, err); first <- r }()
	<-entered
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	close(release)
	r1 := <-first
	r2, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.NotNil(t, r1)
	require.NotNil(t, r2)
	require.Equal(t, "run 1", string(r1.Body))
	require.True(t, r2.Replayed)
	require.Equal(t, r1.Body, r2.Body)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// lateWorkflow is first → charge (its record step runs record) → finish.
func lateWorkflow(first, record func(ctx context.Context, tx atomicphase.Tx) error) *atomicphase.Workflow[struct{}] {
	return atomicphase.MustWorkflow("late", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("first", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), first(ctx, tx)
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, _ *struct{}) error {
			return call.Do(ctx, func(context.Context, string) error { return nil })
		}, func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), record(ctx, tx)
		}),
		atomicphase.Local("finish", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
}

// A duplicate that looked before the first request recorded the key, and
// claims it after that request committed, is answered at once: its claim
// sees the key, and its first unit runs nothing (it does not run against
// the rows the first request then holds, on a pooled connection).
func TestDuplicateThatClaimsAfterTheHolderCommittedAnswersAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'acct', 'acct')`)
	require.NoError(t, err)
	dRunner, err := atomicphase.NewRunner(b.db.Pool, nil) // another process
	require.NoError(t, err)
	dEntered, dGo, oHolds, oGo := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	oWF := lateWorkflow(func(ctx context.Context, tx atomicphase.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}, func(ctx context.Context, tx atomicphase.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE effects SET note = 'o' WHERE phase = 'acct'`); err != nil {
			return err
		}
		close(oHolds)
		<-oGo
		return nil
	})
	dWF := lateWorkflow(func(ctx context.Context, tx atomicphase.Tx) error {
		close(dEntered)
		<-dGo
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the claim rides here
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE effects SET note = 'd' WHERE phase = 'acct'`)
		return err
	}, func(context.Context, atomicphase.Tx) error { return nil })
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/l"}

	dDone := make(chan error, 1)
	go func() { _, err := dRunner.Run(b.ctx, dWF, req); dDone <- err }() // peeks: absent
	<-dEntered
	oDone := make(chan error, 1)
	go func() { _, err := b.runner.Run(b.ctx, oWF, req); oDone <- err }()
	<-oHolds // the key is committed; the record step holds the row
	close(dGo)
	select {
	case err := <-dDone:
		require.ErrorIs(t, err, atomicphase.ErrInProgress)
	case <-time.After(10 * time.Second):
		close(oGo)
		<-dDone
		require.NoError(t, <-oDone)
		t.Fatal("the duplicate was not answered: it ran its first unit against a key another request holds")
	}
	close(oGo)
	require.NoError(t, <-oDone)
	var note string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT note FROM effects WHERE phase = 'acct'`).Scan(&note))
	require.Equal(t, "o", note)
}
