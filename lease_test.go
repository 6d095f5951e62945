package atomicphase_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// slowBank is a downstream without idempotency keys that takes a while: a
// payout it received is made, and visible to lookups, only once its
// processing time has passed, whether or not the caller still waits (its
// caller giving up does not stop it). It counts the calls it received.
type slowBank struct {
	processing time.Duration
	calls      atomic.Int32
	mu         sync.Mutex
	payouts    map[string]int
	wg         sync.WaitGroup
}

func newSlowBank(processing time.Duration) *slowBank {
	return &slowBank{processing: processing, payouts: map[string]int{}}
}

// pay receives a payout for ref, makes it after the processing time, and
// answers then, or earlier with ctx's error when the caller gives up.
func (b *slowBank) pay(ctx context.Context, ref string) error {
	b.calls.Add(1)
	done := make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		time.Sleep(b.processing)
		b.mu.Lock()
		b.payouts[ref]++
		b.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *slowBank) lookup(ref string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.payouts[ref] > 0
}

// total waits for every payout the bank received to be made and counts
// them.
func (b *slowBank) total() int {
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.payouts {
		n += c
	}
	return n
}

func slowPayoutWorkflow(bk *slowBank) *atomicphase.Workflow[payout] {
	return atomicphase.MustWorkflow("slowpayout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				if err := bk.pay(ctx, ref); err != nil {
					return err
				}
				p.PayoutID = "po_" + ref
				return nil
			})
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(p.PayoutID)), nil
		}).WithReconcile(func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) (bool, error) {
			if !bk.lookup(call.Key()) {
				return false, nil
			}
			p.PayoutID = "po_" + call.Key()
			return true, nil
		}),
	}, nil)
}

// retryUntilDone retries req through r every interval, as an impatient
// client does, until a retry gets a response (a replay, or the key's
// completion), and returns it. Refusals while another attempt holds the key
// (409) and failures a retry may fix are what a client retries after.
func retryUntilDone(t *testing.T, r *atomicphase.Runner, wf atomicphase.AnyWorkflow, req atomicphase.Request, interval time.Duration) *atomicphase.Response {
	t.Helper()
	for range 200 {
		time.Sleep(interval)
		resp, err := r.Run(context.Background(), wf, req)
		if err == nil {
			return resp
		}
		require.True(t, atomicphase.Retryable(err), "%v", err)
	}
	t.Fatal("the key never finished")
	return nil
}

// A payout slower than the lock timeout, retried by its client every half
// lock timeout while it runs: the holder renews its lease during the call,
// every retry is refused while it does, and the bank pays once.
func TestSlowCallIsNotSentTwiceWhileItsHolderLives(t *testing.T) {
	t.Parallel()
	const lockTimeout = 300 * time.Millisecond
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout, CallGrace: lockTimeout})
	bk := newSlowBank(800 * time.Millisecond)
	wf := slowPayoutWorkflow(bk)
	first := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(context.Background(), wf, payoutRequest("slow"))
		first <- err
	}()
	// The client retries once its first attempt holds the key and calls
	// the bank (before that, a retry could be the one that records it).
	require.Eventually(t, func() bool { return bk.calls.Load() == 1 }, 30*time.Second, time.Millisecond)
	resp := retryUntilDone(t, b.runner, wf, payoutRequest("slow"), lockTimeout/2)
	require.NoError(t, <-first, "the first attempt kept its lease through the call")
	require.Equal(t, 201, resp.Status)
	require.Equal(t, 1, bk.total(), "one payout")
	require.EqualValues(t, 1, bk.calls.Load(), "one call")
}

// A holder that dies inside a slow call (here: its pool is closed, so it
// cannot renew its lease, and the lease cancels the call) leaves the call
// in flight at the bank. No retry reconciles or calls until the lease has
// ended plus the grace: the payout the bank makes meanwhile is found by
// reconciliation, and made once.
func TestTakeoverWaitsForACallInFlight(t *testing.T) {
	t.Parallel()
	const lockTimeout = 300 * time.Millisecond
	cfg := &atomicphase.Config{LockTimeout: lockTimeout, CallGrace: 1500 * time.Millisecond}
	b := setup(t, cfg)
	bk := newSlowBank(900 * time.Millisecond)
	wf := slowPayoutWorkflow(bk)

	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	dying, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	require.NoError(t, err)
	doomed, err := atomicphase.NewRunner(dying, cfg)
	require.NoError(t, err)
	calling := make(chan struct{})
	var once sync.Once
	wfDoomed := atomicphase.MustWorkflow("slowpayout", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("prepare", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, p *payout) error {
			return call.Do(ctx, func(ctx context.Context, ref string) error {
				once.Do(func() { close(calling) })
				return bk.pay(ctx, ref)
			})
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(p.PayoutID)), nil
		}).WithReconcile(func(context.Context, *atomicphase.ForeignCall, *payout) (bool, error) {
			return false, errors.New("never asked")
		}),
	}, nil)
	first := make(chan error, 1)
	go func() {
		_, err := doomed.Run(context.Background(), wfDoomed, payoutRequest("dies"))
		first <- err
	}()
	<-calling
	dying.Close() // the process is gone: nothing renews its lease

	// Retries begin while the call is still in flight at the bank.
	resp := retryUntilDone(t, b.runner, wf, payoutRequest("dies"), lockTimeout/2)
	require.Error(t, <-first)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, 1, bk.total(), "one payout: reconciliation found the first")
	require.EqualValues(t, 1, bk.calls.Load(), "one call")
}

// A fused unit longer than the lock timeout, each of whose phases fits it,
// is finished by the sweep: the lease is renewed while the unit runs, and
// the sweep's budget is per phase.
func TestSweepFinishesAFusedUnitLongerThanTheLease(t *testing.T) {
	t.Parallel()
	var failed atomic.Bool
	b := setup(t, &atomicphase.Config{LockTimeout: 500 * time.Millisecond, AttemptBackoff: time.Millisecond})
	slow := func(name string) atomicphase.Phase[struct{}] {
		return atomicphase.Local(name, func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			if name == "b" && failed.CompareAndSwap(false, true) {
				return atomicphase.Outcome{}, errors.New("transient, once")
			}
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', $1)`, name); err != nil {
				return atomicphase.Outcome{}, err
			}
			if name == "c" {
				return atomicphase.Respond(200, []byte("done")), nil
			}
			return atomicphase.Continue(), nil
		})
	}
	wf := atomicphase.MustWorkflow("fusedlong", startEmpty[struct{}], []atomicphase.Phase[struct{}]{slow("a"), slow("b"), slow("c")}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/f"})
	require.Error(t, err)
	time.Sleep(5 * time.Millisecond) // past the backoff

	res, err := newSweeper(t, b, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed, "%+v", res)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects WHERE scope = 'u'`), "each phase's write, once")
}

// Duplicates of a new key sent while its first request's first
// transaction runs are refused at once (409) and hold no pooled connection
// while they wait for nothing: with a pool of four, one slow request and
// three duplicates, another tenant's request still runs.
func TestDuplicatesOfANewKeyAreRefusedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // a failed test does not leave the first request blocked
	quick := atomicphase.MustWorkflow("quick", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	slowWF := atomicphase.MustWorkflow("dup", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("only", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('slow', 'k', 'only')`); err != nil {
				return atomicphase.Outcome{}, err
			}
			close(entered)
			<-release
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	req := func(scope string) atomicphase.Request {
		return atomicphase.Request{Scope: scope, Key: "k", Method: "POST", Path: "/d"}
	}
	first := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), slowWF, req("slow"))
		first <- err
	}()
	<-entered
	dups := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := r.Run(context.Background(), slowWF, req("slow"))
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
	other := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), quick, req("other"))
		other <- err
	}()
	select {
	case err := <-other:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("another tenant's request found no connection")
	}
	free()
	require.NoError(t, <-first)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE scope = 'slow'`))
}

// dropsReusedConnServer is an HTTP/1.1 server that answers the first
// request on each connection (keeping the connection open), and on a
// reused connection reads the request, counts it, and hangs up without an
// answer: a server that went away after reading a request on a keep-alive
// connection.
type dropsReusedConnServer struct {
	ln    net.Listener
	posts atomic.Int32
}

func newDropsReusedConnServer(t *testing.T) *dropsReusedConnServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &dropsReusedConnServer{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *dropsReusedConnServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if req.Method == http.MethodPost {
			s.posts.Add(1)
		}
		if n > 0 {
			return // read, then gone
		}
		_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
	}
}

// A foreign call through ForeignCall.Transport is sent once, even when the
// server drops the reused keep-alive connection it read the request on:
// net/http, which takes an Idempotency-Key header for a licence to replay
// a POST, must not send it again below the guard.
func TestTransportIsNotResentByNetHTTP(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{"no body": "", "a body": `{"amount":100}`} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			srv := newDropsReusedConnServer(t)
			url := "http://" + srv.ln.Addr().String() + "/payouts"
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			// A first request opens the connection the call will reuse.
			warm, err := (&http.Client{Transport: base}).Get(url)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, warm.Body)
			require.NoError(t, warm.Body.Close())

			wf := atomicphase.MustWorkflow("transport", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
				atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, _ *struct{}) error {
					var rd io.Reader
					if body != "" {
						rd = strings.NewReader(body)
					}
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, rd)
					if err != nil {
						return err
					}
					resp, err := (&http.Client{Transport: call.Transport(base)}).Do(req)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					_, err = io.Copy(io.Discard, resp.Body)
					return err
				}, func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
					return atomicphase.Respond(201, nil), nil
				}),
			}, nil)
			_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/t"})
			require.Error(t, err, "the call's answer was lost")
			require.EqualValues(t, 1, srv.posts.Load(), "one send")
		})
	}
}

// The same, with the connection broken by faultinject.DropAfterRequest
// on an ordinary server: the request is read once, the answer lost, and the
// call is not sent again.
func TestTransportSendsOnceWhenAnInjectedDropLosesTheAnswer(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	h := faultinject.NewHTTP()
	base := h.Transport(nil)
	t.Cleanup(base.CloseIdleConnections)
	warm, err := (&http.Client{Transport: base}).Get(srv.URL)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, warm.Body)
	require.NoError(t, warm.Body.Close())

	inj := faultinject.New(faultinject.Rule{Phase: "pay", Place: atomicphase.BeforePhase, Action: faultinject.DropAfterRequest})
	inj.HTTP = h
	b := setup(t, &atomicphase.Config{FaultInjector: inj})
	wf := atomicphase.MustWorkflow("transport", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, _ *struct{}) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
			if err != nil {
				return err
			}
			resp, err := (&http.Client{Transport: call.Transport(base)}).Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			return err
		}, func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, nil), nil
		}),
	}, nil)
	_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/t"})
	require.Error(t, err, "the call's answer was lost")
	require.Equal(t, []int{1}, inj.Fired())
	require.EqualValues(t, 1, posts.Load(), "one send")
}

// The lease is stored on the key row: any reader, whatever lock timeout it
// was configured with (the CLI's default, say), sees a dead holder's lock
// go stale when that holder's lease ends.
func TestEveryReaderKnowsTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{LockTimeout: 200 * time.Millisecond, FaultInjector: crashOnce("", atomicphase.AfterAcquire)})
	type st struct{}
	wf := atomicphase.MustWorkflow("lease", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/l"})
	require.ErrorIs(t, err, atomicphase.ErrCrashed)

	reader, err := atomicphase.NewRunner(b.db.Pool, nil) // the default lock timeout, 90s
	require.NoError(t, err)
	var status atomicphase.KeyStatus
	for range 100 {
		info, err := reader.Inspect(b.ctx, "u", "k")
		require.NoError(t, err)
		if status = info.Status; status == atomicphase.KeyStale {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, atomicphase.KeyStale, status, "the holder's lease, not the reader's lock timeout")
}

// A take (Resume, the sweep) whose answer is lost may have taken the key
// with nobody to run it: the key is unlocked by the token, as after a lost
// acquisition answer, and the next attempt resumes it at once rather than
// after the lease.
func TestLostTakeAnswerLeavesTheKeyTakeable(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("losttake", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			if fail.Load() {
				return atomicphase.Outcome{}, errors.New("transient")
			}
			return atomicphase.Respond(200, []byte("done")), nil
		}),
	}, &atomicphase.WorkflowOpts{CommitEachPhase: true})
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/l"})
	require.Error(t, err)
	fail.Store(false)

	var armed atomic.Bool
	pool := answerLosingPool(t, b, &armed, 1)
	lossy, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	require.NoError(t, lossy.Register(wf))
	armed.Store(true)
	_, err = lossy.Resume(b.ctx, "u", "k")
	require.Error(t, err)

	require.NoError(t, b.runner.Register(wf))
	resp, err := b.runner.Resume(b.ctx, "u", "k")
	require.NoError(t, err, "the key stayed locked by nobody")
	require.Equal(t, "done", string(resp.Body))
}
