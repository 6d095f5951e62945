package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// assumeInput is what the requests of these tests carry; an empty item is
// refused by the start function.
type assumeInput struct {
	Item string `json:"item"`
}

type assumeState struct {
	Key      string `json:"key"`
	Item     string `json:"item"`
	ChargeID string `json:"charge_id"`
}

// assumeShop counts what the downstream received: charges by key.
type assumeShop struct {
	mu      sync.Mutex
	charges map[string]int
	// failNext makes the next charge fail, once.
	failNext atomic.Bool
	// creates counts the create phase's runs, kept or not.
	creates atomic.Int64
}

func (s *assumeShop) charge(key string) (string, error) {
	if s.failNext.CompareAndSwap(true, false) {
		return "", errors.New("payment API unreachable")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.charges[key]++
	return "ch_" + key, nil
}

func (s *assumeShop) distinctCharges() (keys, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.charges {
		keys++
		calls += n
	}
	return keys, calls
}

// assumeWorkflow creates a row (queued, or sent on its own with sendAlone),
// charges, and records the charge and responds, assuming new keys.
func assumeWorkflow(t *testing.T, shop *assumeShop, sendAlone bool) *atomicphase.Workflow[assumeState] {
	t.Helper()
	start := func(in assumeInput, req *atomicphase.Request) (assumeState, error) {
		if in.Item == "" {
			return assumeState{}, errors.New("item: required")
		}
		return assumeState{Key: req.Key, Item: in.Item}, nil
	}
	const create = `INSERT INTO effects (scope, key, phase, note) VALUES ($1, $2, 'create', $3)`
	wf, err := atomicphase.NewWorkflow("assume", start, []atomicphase.Phase[assumeState]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *assumeState) (atomicphase.Outcome, error) {
			shop.creates.Add(1)
			if sendAlone {
				if _, err := tx.Exec(ctx, create, "u", s.Key, s.Item); err != nil {
					return atomicphase.Outcome{}, err
				}
				return atomicphase.Continue(), nil
			}
			tx.Queue(create, "u", s.Key, s.Item)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *assumeState) error {
			return call.Do(ctx, func(_ context.Context, key string) error {
				id, err := shop.charge(key)
				s.ChargeID = id
				return err
			})
		}, func(ctx context.Context, tx atomicphase.Tx, s *assumeState) (atomicphase.Outcome, error) {
			tx.Queue(`INSERT INTO effects (scope, key, phase, note) VALUES ('u', $1, 'charge', $2)`, s.Key, s.ChargeID)
			return atomicphase.Respond(201, []byte(s.ChargeID)), nil
		}),
	}, &atomicphase.WorkflowOpts{AssumeNewKeys: true})
	require.NoError(t, err)
	return wf
}

func assumeRequest(key, item string) atomicphase.Request {
	return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/assume",
		Params: fmt.Appendf(nil, `{"item": %q}`, item)}
}

// assumeSetup is a Runner on one traced connection, warmed up so that it
// knows its database commits a batch's implicit transaction whole.
func assumeSetup(t *testing.T, cfg *atomicphase.Config, wf atomicphase.AnyWorkflow, mode ...pgx.QueryExecMode) (*testBundle, *atomicphasetest.RoundTrips) {
	t.Helper()
	counter := &atomicphasetest.RoundTrips{}
	opts := *testDBOpts
	opts.PoolConfig = func(c *pgxpool.Config) {
		c.MaxConns = 1 // one connection, so statements stay prepared
		c.ConnConfig.Tracer = counter
		switch {
		case len(mode) > 0:
			c.ConnConfig.DefaultQueryExecMode = mode[0]
		case c.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe:
			// The option does nothing in this mode (make test/execmodes
			// runs the suite in it): TestAssumeNewKeysDoesNothingInCacheDescribeMode.
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		}
	}
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, cfg)
	require.NoError(t, err)
	b := &testBundle{db: db, runner: runner, ctx: context.Background()}
	_, err = runner.Run(b.ctx, wf, assumeRequest("warm-up", "rocket"))
	require.NoError(t, err)
	return b, counter
}

// With AssumeNewKeys a new key costs two round trips, the hand-written
// shape (its recording, the first phase's write and its recovery point in
// one; the call's record step, the response and the finish in the other),
// and a replay or a reuse of the key still costs one: the key's read rides
// ahead of the recording, and the key that exists stops the batch there.
// The first phase ran for the replay, and nothing it queued was kept.
func TestAssumeNewKeysRecordsInTwoRoundTripsAndAnswersInOne(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the option does nothing there, where no transaction commits implicitly (docs/concepts.md, \"Assuming new keys\")")
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("sendAlone=%t", alone), func(t *testing.T) {
			t.Parallel()
			shop := &assumeShop{charges: map[string]int{}}
			wf := assumeWorkflow(t, shop, alone)
			b, counter := assumeSetup(t, nil, wf)

			counter.Reset()
			resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
			require.NoError(t, err)
			require.False(t, resp.Replayed)
			first := resp.Body
			if alone {
				// A phase that sends on its own reads the key first, on
				// its own, then BEGIN+claim+INSERT, then commit; and the
				// charge's record step: as without the option.
				require.Equal(t, int64(4), counter.Count(), "round trips for a new key, the phase sending on its own")
			} else {
				require.Equal(t, int64(2), counter.Count(), "round trips for a new key, writes queued")
			}
			creates := shop.creates.Load()

			counter.Reset()
			resp, err = b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
			require.NoError(t, err)
			require.True(t, resp.Replayed)
			require.Equal(t, 201, resp.Status)
			require.Equal(t, first, resp.Body, "the replay's bytes")
			require.Equal(t, int64(1), counter.Count(), "a replay is one round trip")
			require.Equal(t, creates+1, shop.creates.Load(), "the create phase ran, up to its first statement or its write queued")

			counter.Reset()
			_, err = b.runner.Run(b.ctx, wf, assumeRequest("k1", "a different item"))
			require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
			require.Equal(t, int64(1), counter.Count(), "a key reused with another request is one round trip")

			keys, calls := shop.distinctCharges()
			require.Equal(t, 2, keys, "warm-up and k1")
			require.Equal(t, 2, calls, "one charge per key")
			require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects WHERE key = 'k1'`),
				"k1's create and charge rows, once each: nothing the replay and the reuse ran was kept")
		})
	}
}

// A request whose start function refuses it is told it reuses another
// request's key when the key exists, as without the option: the refusal of
// its input is the answer only for a new key, which stays unrecorded.
func TestAssumeNewKeysAnswersKeyReuseBeforeTheStartsRefusal(t *testing.T) {
	t.Parallel()
	shop := &assumeShop{charges: map[string]int{}}
	wf := assumeWorkflow(t, shop, false)
	b, _ := assumeSetup(t, nil, wf)

	_, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, assumeRequest("k1", ""))
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)

	_, err = b.runner.Run(b.ctx, wf, assumeRequest("k2", ""))
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k2'`), "a refused new key is not recorded")
	_, err = b.runner.Run(b.ctx, wf, assumeRequest("k2", "rocket"))
	require.NoError(t, err, "the corrected request reuses the key")
}

// A key whose attempt failed after its first unit committed is resumed by
// the retry, which found it with the read ahead of its recording: the
// first phase is not committed twice, and the charge goes out once.
func TestAssumeNewKeysResumesAFailedKey(t *testing.T) {
	t.Parallel()
	shop := &assumeShop{charges: map[string]int{}}
	wf := assumeWorkflow(t, shop, false)
	b, _ := assumeSetup(t, nil, wf)

	shop.failNext.Store(true)
	_, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.Error(t, err)
	require.True(t, atomicphase.Retryable(err), "a transient failure: %v", err)
	resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	require.False(t, resp.Replayed)
	require.Equal(t, "ch_", string(resp.Body[:3]))
	keys, calls := shop.distinctCharges()
	require.Equal(t, 2, keys)
	require.Equal(t, 2, calls)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'k1' AND phase = 'create'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'k1' AND phase = 'charge'`))
}

// Duplicates of a new key sent at once: one records it and pays, the rest
// are told it is in progress or replay its answer; nothing the others ran
// is kept, and the observer hears of one creation and no failed phase.
func TestAssumeNewKeysDuplicatesPayOnce(t *testing.T) {
	t.Parallel()
	shop := &assumeShop{charges: map[string]int{}}
	wf := assumeWorkflow(t, shop, false)
	var created, phaseFailed, replays atomic.Int64
	obs := atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		if e.Key != "dup" {
			return
		}
		switch e.Kind {
		case atomicphase.EventCreated:
			created.Add(1)
		case atomicphase.EventPhaseFailed:
			phaseFailed.Add(1)
		case atomicphase.EventReplay:
			replays.Add(1)
		}
	})
	b := setup(t, &atomicphase.Config{Observer: obs})
	_, err := b.runner.Run(b.ctx, wf, assumeRequest("warm-up", "rocket"))
	require.NoError(t, err)

	const n = 12
	bodies := make(chan []byte, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := b.runner.Run(b.ctx, wf, assumeRequest("dup", "rocket"))
				var inProgress *atomicphase.InProgressError
				if errors.As(err, &inProgress) {
					continue // a client retries
				}
				if err != nil {
					t.Errorf("duplicate: %v", err)
					return
				}
				bodies <- resp.Body
				return
			}
		}()
	}
	wg.Wait()
	close(bodies)
	for body := range bodies {
		require.Equal(t, "ch_", string(body[:3]))
	}
	keys, calls := shop.distinctCharges()
	require.Equal(t, 2, keys)
	require.Equal(t, 2, calls, "the duplicates paid once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'dup' AND phase = 'create'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'dup' AND phase = 'charge'`))
	require.Equal(t, int64(1), created.Load(), "one creation")
	require.Equal(t, int64(n-1), replays.Load(), "every other duplicate replayed")
	require.Zero(t, phaseFailed.Load(), "no phase failed: the duplicates' runs were never theirs")
}

// A key that exists ends the batch that was to record it with an error. pgx
// takes any failed batch for stale cached plans, and would deallocate the
// batch's statements and prepare them again on the next request (two more
// round trips): the statements of such a batch are prepared by name, out
// of the cache, and survive. The connection goes back to the pool whole.
func TestAssumeNewKeysKeepsTheStatementsOfAReplay(t *testing.T) {
	t.Parallel()
	shop := &assumeShop{charges: map[string]int{}}
	wf := assumeWorkflow(t, shop, false)
	b, _ := assumeSetup(t, nil, wf)
	prepared := func() map[string]string { return preparedStatements(t, b) }
	_, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	_, err = b.runner.Run(b.ctx, wf, assumeRequest("k2", "rocket"))
	require.NoError(t, err)
	before := prepared()
	opened := b.db.Pool.Stat().NewConnsCount()
	for i := range 5 {
		resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		_, err = b.runner.Run(b.ctx, wf, assumeRequest(fmt.Sprintf("new-%d", i), "rocket"))
		require.NoError(t, err)
	}
	require.Equal(t, before, prepared(), "the connection's prepared statements, and when each was prepared")
	require.Equal(t, opened, b.db.Pool.Stat().NewConnsCount(), "connections opened by the replays")
}

// A statement prepared by name is never prepared again by pgx: when the
// server loses it (DEALLOCATE ALL) or its plan goes stale (a column added
// to a table a RETURNING * reads), every later batch on the connection
// would fail, and park its key. A batch that fails for another reason than
// its key deallocates them, and the next one prepares them again, as pgx's
// cache does.
func TestAssumeNewKeysRecoversFromLostStatements(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, sql string }{
		{"deallocate all", `DEALLOCATE ALL`},
		{"a column added", `ALTER TABLE effects ADD COLUMN extra int`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			start := func(in assumeInput, req *atomicphase.Request) (assumeState, error) {
				return assumeState{Key: req.Key, Item: in.Item}, nil
			}
			wf, err := atomicphase.NewWorkflow("lost", start, []atomicphase.Phase[assumeState]{
				atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *assumeState) (atomicphase.Outcome, error) {
					tx.Queue(`INSERT INTO effects (scope, key, phase) VALUES ('u', $1, 'create') RETURNING *`, s.Key)
					return atomicphase.Respond(201, []byte("ok")), nil
				}),
			}, &atomicphase.WorkflowOpts{AssumeNewKeys: true})
			require.NoError(t, err)
			b, _ := assumeSetup(t, nil, wf)
			for _, k := range []string{"k1", "k1", "k2"} {
				_, err = b.runner.Run(b.ctx, wf, assumeRequest(k, "x"))
				require.NoError(t, err)
			}
			_, err = b.db.Pool.Exec(b.ctx, c.sql, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			var failed []string
			for i := range 6 {
				if _, err := b.runner.Run(b.ctx, wf, assumeRequest(fmt.Sprintf("n%d", i), "x")); err != nil {
					failed = append(failed, fmt.Sprintf("n%d: %v", i, err))
				}
			}
			require.LessOrEqual(t, len(failed), 2, "new keys that failed after the statements were lost: %q", failed)
			for i := 4; i < 6; i++ {
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1 AND response_status = 201`, fmt.Sprintf("n%d", i)),
					"n%d finished once the connection recovered", i)
			}
		})
	}
}

// In pgx's QueryExecModeCacheDescribe (the mode for PgBouncer's
// transaction pooling), a failed batch costs its statements' descriptions,
// described again in a round trip of their own: the option does nothing
// there, and a key is read first, as without it.
func TestAssumeNewKeysDoesNothingInCacheDescribeMode(t *testing.T) {
	t.Parallel()
	shop := &assumeShop{charges: map[string]int{}}
	wf := assumeWorkflow(t, shop, false)
	b, counter := assumeSetup(t, nil, wf, pgx.QueryExecModeCacheDescribe)
	_, err := b.runner.Run(b.ctx, wf, assumeRequest("k0", "rocket"))
	require.NoError(t, err)
	creates := shop.creates.Load()
	counter.Reset()
	_, err = b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	require.Equal(t, int64(3), counter.Count(), "the key read, then the two units")
	resp, err := b.runner.Run(b.ctx, wf, assumeRequest("k1", "rocket"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, creates+1, shop.creates.Load(), "the replay ran no phase")
}

// preparedStatements returns the statements prepared on b's pool's one
// connection, by name, with when each was prepared; read in the simple
// protocol, so that the query itself prepares nothing.
func preparedStatements(t *testing.T, b *testBundle) map[string]string {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT name, prepare_time::text FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	m := map[string]string{}
	for rows.Next() {
		var name, at string
		require.NoError(t, rows.Scan(&name, &at))
		m[name] = at
	}
	require.NoError(t, rows.Err())
	return m
}
