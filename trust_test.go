package atomicphase_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// seen records what the downstream of a test received.
type seen struct {
	mu   sync.Mutex
	keys []string
	n    atomic.Int32
}

func (s *seen) add(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, k)
}

func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// A client SDK that sets a random Idempotency-Key of its own (as stripe-go
// does unless told otherwise) must not reach the downstream with it: one
// request, one downstream key, on every retry.
func TestTransportSendsTheDerivedKeyOverTheRequestsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	var failRecord atomic.Bool
	failRecord.Store(true)
	type st struct{ Keys []string }
	var attempt atomic.Int32
	wf := atomicphase.MustWorkflow("sdk_key", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", "sdk-random-"+string(rune('a'+attempt.Add(1))))
			resp, err := (&http.Client{Transport: call.Transport(nil)}).Do(req)
			if err != nil {
				return err
			}
			return resp.Body.Close()
		}, func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			if failRecord.Swap(false) {
				return atomicphase.Outcome{}, errors.New("record step fails once")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/sdk"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	keys := got.all()
	require.Len(t, keys, 2, "the retry repeats the call")
	require.Equal(t, keys[0], keys[1], "both calls carry the same downstream key")
	require.True(t, strings.HasPrefix(keys[0], "ap_"), "the derived key, not the SDK's: %q", keys[0])
}

// A redirect that the HTTP client follows is part of the one call, not a
// second foreign call that would strand the key.
func TestTransportFollowsRedirectsAsOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var posts, gets atomic.Int32
	var lastKey atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastKey.Store(r.Header.Get("Idempotency-Key"))
		if r.Method == http.MethodPost {
			posts.Add(1)
			http.Redirect(w, r, "/charges/ch_1", http.StatusSeeOther)
			return
		}
		gets.Add(1)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	t.Cleanup(srv.Close)
	type st struct{ Charge string }
	wf := atomicphase.MustWorkflow("redirect", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", nil)
			resp, err := (&http.Client{Transport: call.Transport(nil)}).Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var out struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				return err
			}
			s.Charge = out.ID
			return nil
		}, func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(s.Charge)), nil
		}),
	}, nil)
	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"})
	require.NoError(t, err)
	require.Equal(t, "ch_1", string(resp.Body))
	require.EqualValues(t, 1, posts.Load())
	require.EqualValues(t, 1, gets.Load())
	require.True(t, strings.HasPrefix(lastKey.Load().(string), "ap_"), "the follow-up carries the downstream key too")
}

type shopInput struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

type shopState struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
	Declined string `json:"declined,omitempty"` // computed by the charge phase
	ChargeID string `json:"charge_id,omitempty"`
}

func startShop(in shopInput, _ *atomicphase.Request) (shopState, error) {
	if in.Quantity < 1 {
		return shopState{}, errors.New("quantity must be at least 1")
	}
	return shopState{Item: in.Item, Quantity: in.Quantity}, nil
}

// shopWorkflow charges unless the charge phase itself decided to decline;
// chargesMade counts the calls that charged.
func shopWorkflow(chargesMade *atomic.Int32) *atomicphase.Workflow[shopState] {
	return atomicphase.MustWorkflow("shop", startShop, []atomicphase.Phase[shopState]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *shopState) error {
			return call.Do(ctx, func(context.Context, string) error {
				chargesMade.Add(1)
				s.ChargeID = "ch_1"
				return nil
			})
		}, func(ctx context.Context, tx pgx.Tx, s *shopState) (atomicphase.Outcome, error) {
			if s.Declined != "" {
				return atomicphase.Respond(402, []byte(s.Declined)), nil
			}
			return atomicphase.Respond(201, []byte(s.ChargeID)), nil
		}),
	}, nil)
}

// What the client sends is input; what phases compute is state. A body
// that names a computed field cannot set it.
func TestRequestBodyCannotSetComputedState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	resp, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy",
		Params: []byte(`{"item":"rocket","quantity":1,"declined":"ha","charge_id":"ch_forged"}`)})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status, "the body's declined member reached the state")
	require.Equal(t, "ch_1", string(resp.Body))
	require.EqualValues(t, 1, charges.Load())
}

// Member names match field names exactly: the fingerprint tells "Quantity"
// and "quantity" apart, so the decoded input must too.
func TestInputMemberNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	_, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy",
		Params: []byte(`{"item":"rocket","Quantity":2}`)})
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.Contains(t, err.Error(), "case-sensitive")
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

// A phase resumed after a crash sees the very state bytes the first attempt
// committed, so what it sends downstream under the same key is identical.
func TestStateBytesAreTheSameWhenResumed(t *testing.T) {
	t.Parallel()
	type st struct {
		Extra json.RawMessage `json:"extra"`
		Z     int             `json:"z"`
		A     float64         `json:"a"`
	}
	type in struct {
		Extra json.RawMessage `json:"extra"`
	}
	sent := &seen{}
	var fail atomic.Bool
	wf := atomicphase.MustWorkflow("verbatim", func(i in, _ *atomicphase.Request) (st, error) {
		return st{Extra: i.Extra, Z: 1, A: 1e21}, nil
	}, []atomicphase.Phase[st]{
		atomicphase.Local("first", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("send", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			b, _ := json.Marshal(s)
			sent.add(string(b))
			if fail.Swap(false) {
				return errors.New("downstream 503")
			}
			return nil
		}, func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/v",
		Params: []byte(`{"extra": {"b": 1e2, "a": [1.50, "x"]}}`)}

	clean := setup(t, nil)
	_, err := clean.runner.Run(clean.ctx, wf, req)
	require.NoError(t, err)

	resumed := setup(t, nil)
	fail.Store(true)
	_, err = resumed.runner.Run(resumed.ctx, wf, req)
	require.Error(t, err)
	_, err = resumed.runner.Run(resumed.ctx, wf, req)
	require.NoError(t, err)

	all := sent.all()
	require.Len(t, all, 3)
	require.Equal(t, all[0], all[1], "the first attempt after the first phase")
	require.Equal(t, all[0], all[2], "the resumed attempt sees the bytes the first one committed")
}

// A key row deleted (reaped, or forgotten by an operator) and recorded again
// by the same client key is a new request: its foreign calls carry new
// downstream keys, so the downstream cannot replay the old row's result.
func TestNewRowUnderAnOldKeyGetsNewDownstreamKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := &seen{}
	var failOnce atomic.Bool
	type st struct{}
	wf := atomicphase.MustWorkflow("salted", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			got.add(call.Key())
			if failOnce.Swap(false) {
				return errors.New("transient")
			}
			return nil
		}, func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/s"}
	failOnce.Store(true)
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	resp, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.False(t, resp.Replayed)
	keys := got.all()
	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1], "retries of one row share the downstream key")
	require.NotEqual(t, keys[1], keys[2], "a new row under the same client key gets a new one")
}

// A finished key keeps only what a replay needs.
func TestFinishedKeyKeepsNoState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	params := []byte(`{"item":"card tok_secret","quantity":1}`)
	_, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy", Params: params})
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Nil(t, info.State)
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE state IS NOT NULL`))

	kept := atomicphase.MustWorkflow("kept", startShop, []atomicphase.Phase[shopState]{
		atomicphase.Local("done", func(ctx context.Context, tx pgx.Tx, s *shopState) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, &atomicphase.WorkflowOpts{KeepFinishedState: true})
	_, err = b.runner.Run(b.ctx, kept, atomicphase.Request{Scope: "u", Key: "k2", Method: "POST", Path: "/buy", Params: params})
	require.NoError(t, err)
	info, err = b.runner.Inspect(b.ctx, "u", "k2")
	require.NoError(t, err)
	require.JSONEq(t, `{"item":"card tok_secret","quantity":1}`, string(info.State))
}

// Statements sent through tx.Conn() belong to the phase's transaction: they
// roll back with a failed phase.
func TestPhaseTxConnIsInsideTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("conn", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("write", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			if _, err := tx.Conn().Exec(ctx, `INSERT INTO effects (scope, key, phase) VALUES ('u', 'k', 'write')`); err != nil {
				return atomicphase.Outcome{}, err
			}
			if fail.Swap(false) {
				return atomicphase.Outcome{}, errors.New("phase fails after writing")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/c"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "the failed phase's write survived")
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// parked reads a key's parked mark and last error.
func parked(t *testing.T, b *testBundle, scope, key string) (bool, string) {
	t.Helper()
	info, err := b.runner.Inspect(b.ctx, scope, key)
	require.NoError(t, err)
	if info.ParkedAt == nil {
		return false, ""
	}
	require.NotNil(t, info.LastError)
	require.False(t, info.Locked, "a parked key is unlocked")
	return true, *info.LastError
}

// An error a phase marks Permanent parks the key and is final for the
// client; a later retry (the code fixed) resumes it.
func TestPermanentErrorParksTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var broken atomic.Bool
	broken.Store(true)
	var calls atomic.Int32
	type st struct{}
	wf := atomicphase.MustWorkflow("perm", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("check", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			calls.Add(1)
			if broken.Load() {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("downstream says 400: unknown account"))
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.False(t, atomicphase.Retryable(err), "a client must not loop on it")
	isParked, why := parked(t, b, "u", "k")
	require.True(t, isParked)
	require.Contains(t, why, "unknown account")

	broken.Store(false)
	resp, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
	require.EqualValues(t, 2, calls.Load())
	isParked, _ = parked(t, b, "u", "k")
	require.False(t, isParked)
}

// The framework's own programming errors are permanent: a retry would
// meet them again.
func TestProgrammingErrorsArePermanent(t *testing.T) {
	t.Parallel()
	type st struct{}
	for name, phase := range map[string]atomicphase.Phase[st]{
		"no response": atomicphase.Local("last", func(context.Context, pgx.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		"second foreign call": atomicphase.Foreign("call", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			_ = call.Do(ctx, func(context.Context, string) error { return nil })
			_ = call.Do(ctx, func(context.Context, string) error { return nil })
			return nil
		}, nil),
		"informational status": atomicphase.Local("early", func(context.Context, pgx.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(103, nil), nil
		}),
		"undeclared jump": atomicphase.Local("jump", func(context.Context, pgx.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.JumpTo("nowhere"), nil
		}),
		"data error": atomicphase.Local("insert", func(ctx context.Context, tx pgx.Tx, _ *st) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', 'insert', $1)`, "nul \x00 byte")
			return atomicphase.Continue(), err
		}),
		"division by zero": atomicphase.Local("divide", func(ctx context.Context, tx pgx.Tx, _ *st) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `SELECT $1::int / 0`, 1)
			return atomicphase.Continue(), err
		}),
		"misspelt column": atomicphase.Local("insert", func(ctx context.Context, tx pgx.Tx, _ *st) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects (scoop) VALUES ('u')`)
			return atomicphase.Continue(), err
		}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			if name == "data error" && b.db.Pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
				// pgx interpolates the argument into the SQL text, and the
				// server refuses a Query message with a NUL in it as a
				// protocol violation (08P01, a connection exception): the
				// phase fails as transient, not permanent.
				t.Skip("simple_protocol cannot send a NUL byte in text; the server answers 08P01, classed as a lost connection")
			}
			wf := atomicphase.MustWorkflow("prog", startEmpty[st], []atomicphase.Phase[st]{phase}, nil)
			_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"})
			require.ErrorIs(t, err, atomicphase.ErrPermanent)
			require.False(t, atomicphase.Retryable(err))
			isParked, _ := parked(t, b, "u", "k")
			require.True(t, isParked)
		})
	}
}

// Renaming a phase strands no key: the workflow declares the former name,
// and keys stopped there resume after the renamed phase. Without it, the
// key is parked rather than retried forever.
func TestRenamedPhaseResumesKeysAtItsFormerName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{ Steps []string }
	var failSecond atomic.Bool
	failSecond.Store(true)
	second := atomicphase.Local("second", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
		if failSecond.Load() {
			return atomicphase.Outcome{}, errors.New("transient")
		}
		s.Steps = append(s.Steps, "second")
		return atomicphase.Respond(200, []byte(strings.Join(s.Steps, ","))), nil
	})
	v1 := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("first", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			s.Steps = append(s.Steps, "first")
			return atomicphase.Continue(), nil
		}),
		second,
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"}
	_, err := b.runner.Run(b.ctx, v1, req)
	require.Error(t, err)
	failSecond.Store(false)

	renamedWithout := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("prepare", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		second,
	}, nil)
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = other.Run(b.ctx, renamedWithout, req)
	require.ErrorIs(t, err, atomicphase.ErrPermanent, "an unknown recovery point is no transient error")
	isParked, why := parked(t, b, "u", "k")
	require.True(t, isParked)
	require.Contains(t, why, `"first"`)

	renamed := atomicphase.MustWorkflow("renamed", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("prepare", func(ctx context.Context, tx pgx.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}).WithFormerNames("first"),
		second,
	}, nil)
	third, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	resp, err := third.Run(b.ctx, renamed, req)
	require.NoError(t, err)
	require.Equal(t, "first,second", string(resp.Body))
}

// answerLosingConn lets the next statement that executes reach the server
// and complete there, then breaks the connection before the client reads
// the answer: a lost acknowledgement.
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
// able to resume at once, not after the lock timeout.
func TestLostAcquisitionAnswerLeavesTheKeyTakeable(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	var armed atomic.Bool
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &answerLosingConn{Conn: c, armed: &armed}, nil
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(b.ctx)) // connected before arming
	runner, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	type st struct{}
	wf := atomicphase.MustWorkflow("lostack", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, pgx.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("done")), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/l"}

	armed.Store(true)
	_, err = runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.True(t, atomicphase.Retryable(err))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`), "the acquisition committed unseen")

	resp, err := runner.Run(b.ctx, wf, req)
	require.NoError(t, err, "the retry was refused: the key stayed locked by nobody")
	require.Equal(t, "done", string(resp.Body))
}

func TestScopeIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	wf := atomicphase.MustWorkflow("scoped", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, pgx.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	for name, scope := range map[string]string{"empty": "", "too long": strings.Repeat("s", 256), "NUL": "a\x00b"} {
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: scope, Key: "k", Method: "POST", Path: "/s"})
		require.ErrorIs(t, err, atomicphase.ErrInvalidScope, name)
		require.NotErrorIs(t, err, atomicphase.ErrInvalidKey, "%s: the client's key is fine", name)
		require.False(t, atomicphase.Retryable(err))
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

func TestTypedNilWorkflowIsAnErrorNotAPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wf *atomicphase.Workflow[struct{}]
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.ErrorContains(t, err, "nil workflow")
	require.ErrorContains(t, b.runner.Register(wf), "nil workflow")
}

func TestReservedSchemaNameIsRefused(t *testing.T) {
	t.Parallel()
	_, err := atomicphase.NewRunner(&pgxpool.Pool{}, &atomicphase.Config{Schema: "pg_keys"})
	require.ErrorContains(t, err, "reserves")
	_, err = atomicphase.Migrate(context.Background(), nil, &atomicphase.MigrateOpts{Schema: "pg_keys"})
	require.ErrorContains(t, err, "reserves")
}
