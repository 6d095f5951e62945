package atomicphase_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestRunConcurrentDuplicatesRunPhasesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})

	const n = 50
	var (
		wg                         sync.WaitGroup
		mu                         sync.Mutex
		fresh, replays, inProgress int
		bodies                     = map[string]bool{}
		start                      = make(chan struct{})
		unexpected                 []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "same-key"))
			mu.Lock()
			defer mu.Unlock()
			var ip *atomicphase.InProgressError
			switch {
			case errors.As(err, &ip):
				require.Positive(t, ip.RetryAfter)
				inProgress++
			case err != nil:
				unexpected = append(unexpected, err)
			case resp.Replayed:
				replays++
				bodies[string(resp.Body)] = true
			default:
				fresh++
				bodies[string(resp.Body)] = true
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, unexpected)
	require.Equal(t, 1, fresh, "exactly one attempt runs the phases")
	require.Equal(t, n, fresh+replays+inProgress)
	require.Len(t, bodies, 1, "every answer carries the same body")
	// A duplicate that reads the key before the first attempt's first
	// transaction commits may run create's function too, in a transaction
	// that then rolls back: what counts is what committed, and the call.
	require.Equal(t, int32(1), c.charge.Load(), "one charge")
	require.Equal(t, int32(1), c.finish.Load())
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"), "one create and one finish committed")
}

func TestRunDuplicateAnsweredAtOnceDuringSlowForeignCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	entered := make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			close(entered)
			<-release // a slow downstream
			s.ChargeID = "ch_slow"
			return nil
		})
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered

	// The holder is inside its foreign call: it must hold no row lock, no
	// transaction and no connection, so the duplicate is answered at once.
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	_, err := b.runner.Run(ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	require.Zero(t, b.count(t, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`), "no transaction is open during the foreign call")
	require.Zero(t, b.db.Pool.Stat().AcquiredConns()-0, "no pooled connection is held during the foreign call")

	close(release)
	require.NoError(t, <-done)
}

// TestReplayWritesNothing checks that replays leave the key row's tuple
// alone: same xmin, same ctid, so no new row version, no dead tuple.
func TestReplayWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)

	version := func() string {
		var v string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, "SELECT xmin::text || '@' || ctid::text FROM idempotency_keys").Scan(&v))
		return v
	}
	before := version()
	for range 20 {
		resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		require.NoError(t, err)
		require.True(t, resp.Replayed)
	}
	other := orderRequest("u", "k")
	other.Params = []byte(`{"item":"boat","quantity":1}`)
	_, err = b.runner.Run(b.ctx, wf, other)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.Equal(t, before, version(), "replays and mismatches do not rewrite the key row")
}

// lockKey makes (u, key) look held by an attempt that took it age ago and
// has committed nothing since, as a crashed or stalled process leaves it.
func lockKey(t *testing.T, b *testBundle, key string, age time.Duration) {
	t.Helper()
	tag, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET locked_at = now() - $2 * interval '1 microsecond', status = 'r',
		    next_attempt_at = coalesce(next_attempt_at, created_at)
		WHERE scope = 'u' AND idempotency_key = $1 AND response_status IS NULL`, key, age.Microseconds())
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// TestStaleLockIsTakenOver checks the stale-lock rule from both sides of the
// lock timeout, through both ways of taking a key: a lock younger than
// Config.LockTimeout keeps Run and Resume out; an older one lets them in,
// with a new lock token, at the key's recovery point.
func TestStaleLockIsTakenOver(t *testing.T) {
	t.Parallel()
	const lockTimeout = time.Minute
	takers := map[string]func(b *testBundle, wf atomicphase.AnyWorkflow) (*atomicphase.Response, error){
		"Run": func(b *testBundle, wf atomicphase.AnyWorkflow) (*atomicphase.Response, error) {
			return b.runner.Run(b.ctx, wf, asRetry(orderRequest("u", "k")))
		},
		"Resume": func(b *testBundle, _ atomicphase.AnyWorkflow) (*atomicphase.Response, error) {
			return b.runner.Resume(b.ctx, "u", "k")
		},
	}
	for name, take := range takers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout})
			var c counters
			fail := true
			wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
				if fail {
					return errors.New("down")
				}
				return call.Do(ctx, func(context.Context, string) error { s.ChargeID = "ch_t"; return nil })
			}})
			_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
			require.Error(t, err)
			require.NoError(t, b.runner.Register(wf))
			fail = false
			before, err := b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)

			for _, age := range []time.Duration{0, time.Second, lockTimeout - 5*time.Second} {
				lockKey(t, b, "k", age)
				_, err := take(b, wf)
				var ip *atomicphase.InProgressError
				require.ErrorAs(t, err, &ip, "a lock %s old is live", age)
				require.Positive(t, ip.LockExpiresIn)
				require.LessOrEqual(t, ip.LockExpiresIn, lockTimeout-age)
				require.Greater(t, ip.LockExpiresIn, lockTimeout-age-5*time.Second)
			}
			info, err := b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			require.Equal(t, before.LockToken, info.LockToken, "a live lock is not taken")
			require.Equal(t, int32(1), c.charge.Load())

			lockKey(t, b, "k", lockTimeout+time.Second)
			resp, err := take(b, wf)
			require.NoError(t, err, "a lock older than the lock timeout is stale")
			require.Equal(t, 201, resp.Status)
			require.False(t, resp.Replayed)
			require.Contains(t, string(resp.Body), `"charge_id":"ch_t"`)
			require.Equal(t, []int32{1, 2, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()}, "resumed after create")
			info, err = b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			require.NotEqual(t, before.LockToken, info.LockToken, "the takeover took the key under a token of its own")
			require.Equal(t, atomicphase.RecoveryPointFinished, info.RecoveryPoint)
		})
	}
}

// TestLockExpiresIn checks what Inspect and the in-progress error say of a
// key an attempt really holds: it goes stale within (0, LockTimeout].
func TestLockExpiresIn(t *testing.T) {
	t.Parallel()
	const lockTimeout = 30 * time.Second
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout})
	entered, release := make(chan struct{}), make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		close(entered)
		<-release
		return call.Do(ctx, func(context.Context, string) error { return nil })
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered

	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, info.Locked)
	require.NotNil(t, info.LockExpiresIn)
	require.Greater(t, *info.LockExpiresIn, 0.0)
	require.LessOrEqual(t, *info.LockExpiresIn, lockTimeout.Seconds())

	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var ip *atomicphase.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Positive(t, ip.LockExpiresIn)
	require.LessOrEqual(t, ip.LockExpiresIn, lockTimeout)
	require.Equal(t, time.Second, ip.RetryAfter, "a lock with more than a second to go says retry in a second")

	close(release)
	require.NoError(t, <-done)
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.False(t, info.Locked)
	require.Nil(t, info.LockExpiresIn, "a key nobody holds has no lock to expire")
}

// answerLosingConn lets the next statement that executes reach the server
// and complete there, then breaks the connection before the client reads
// the answer: a lost acknowledgement.
// answerLosingPool is a pool on b's database whose connections, once armed
// is set, lose the answer to the next statement sent (answerLosingConn),
// of at most maxConns connections (pgxpool's default for 0), connected
// before it returns so that arming it catches a statement, not a dial.
func answerLosingPool(t *testing.T, b *testBundle, armed *atomic.Bool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &answerLosingConn{Conn: c, armed: armed}, nil
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(b.ctx))
	return pool
}

type answerLosingConn struct {
	net.Conn
	armed   *atomic.Bool
	pending bool // an Execute or a simple Query was written while armed
}

func (c *answerLosingConn) Write(p []byte) (int, error) {
	// Execute in the extended protocol, Query in the simple one (pgx's
	// simple_protocol exec mode).
	if c.armed.Load() && (hasMessage(p, 'E') || hasMessage(p, 'Q')) {
		c.pending = true
	}
	return c.Conn.Write(p)
}

func (c *answerLosingConn) Read(p []byte) (int, error) {
	if !c.pending {
		return c.Conn.Read(p)
	}
	c.pending = false
	c.armed.Store(false)
	// Drain the whole answer, up to ReadyForQuery, so the statement has
	// certainly finished on the server; then hang up.
	var buf []byte
	chunk := make([]byte, 4096)
	for !hasMessage(buf, 'Z') {
		n, err := c.Conn.Read(chunk)
		if err != nil {
			return 0, err
		}
		buf = append(buf, chunk[:n]...)
	}
	_ = c.Conn.Close()
	return 0, io.ErrUnexpectedEOF
}

// hasMessage reports whether buf, a run of whole protocol messages, holds
// one of type typ.
func hasMessage(buf []byte, typ byte) bool {
	for len(buf) >= 5 {
		n := int(binary.BigEndian.Uint32(buf[1:5]))
		if buf[0] == typ {
			return true
		}
		if n+1 > len(buf) {
			return false
		}
		buf = buf[n+1:]
	}
	return false
}

// An acquisition whose answer is lost may have recorded and locked the key
// with nobody to run it. The client is told to retry; the retry must be
// able to resume at once, not after the lock timeout. With phase fusion the
// key's recording commits with the first phase: the same holds when that
// commit's answer is lost.
func TestLostAcquisitionAnswerLeavesTheKeyTakeable(t *testing.T) {
	t.Parallel()
	for name, fused := range map[string]bool{"acquired on its own": false, "recorded with the first phase": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var armed atomic.Bool
			pool := answerLosingPool(t, b, &armed, 1)
			runner, err := atomicphase.NewRunner(pool, nil)
			require.NoError(t, err)
			type st struct{}
			wf := atomicphase.MustWorkflow("lostack", startEmpty[st], []atomicphase.Phase[st]{
				atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
					if fused {
						armed.Store(true) // the next thing sent is the commit that records the key
					}
					return atomicphase.Respond(200, []byte("done")), nil
				}),
			}, &atomicphase.WorkflowOpts{CommitEachPhase: !fused})
			req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/l"}
			// The version is recorded before the connection is armed (a
			// process's first request of it would record it first).
			require.NoError(t, runner.Register(wf))
			require.NoError(t, runner.RecordVersions(b.ctx))

			armed.Store(!fused)
			_, err = runner.Run(b.ctx, wf, req)
			require.Error(t, err)
			require.True(t, atomicphase.Retryable(err), "%v", err)
			if !fused {
				require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`), "the acquisition committed unseen")

			resp, err := runner.Run(b.ctx, wf, req)
			require.NoError(t, err, "the retry was refused: the key stayed locked by nobody")
			require.Equal(t, "done", string(resp.Body))
		})
	}
}

// An acquisition that lost the race for a key twice in a row reports no
// expiry, so the caller is told to retry after the default second, never
// "retry after 0". A trigger that skips every update of a key makes the
// upsert find nothing to take, as a racing attempt would.
func TestContendedAcquisitionAsksForAPositiveRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("contended", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			if fail.Load() {
				return atomicphase.Outcome{}, errors.New("transient")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	if atomicphasetest.OnCitus() { // Citus puts a trigger on a distributed table only when told it is safe
		_, err = conn.Exec(b.ctx, `SET citus.enable_unsafe_triggers = on`)
		require.NoError(t, err)
	}
	_, err = conn.Exec(b.ctx, `CREATE FUNCTION skip_update() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `CREATE TRIGGER skip_update BEFORE UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION skip_update()`)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, req)
	var inProgress *atomicphase.InProgressError
	require.ErrorAs(t, err, &inProgress)
	require.Equal(t, time.Second, inProgress.RetryAfter)
}
