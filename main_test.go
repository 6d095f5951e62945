package atomicphase_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// testDBOpts adds the business table test workflows write to, so tests can
// count rows in the database rather than trust counters.
// On Citus it is distributed by scope, colocated with the key table.
var testDBOpts = &atomicphasetest.Options{
	SetupID: "core-tests-v2",
	Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, `CREATE TABLE effects (
			id    bigserial,
			scope text NOT NULL,
			key   text NOT NULL,
			phase text NOT NULL,
			note  text,
			PRIMARY KEY (scope, id))`)
		return err
	},
	Distribute: map[string]string{"effects": "scope"},
}

// unmigratedDBOpts hands out databases with the effects table but without
// the atomicphase schema, for tests of Migrate, MigrateOpts.Schema and
// CheckSchema.
var unmigratedDBOpts = &atomicphasetest.Options{
	SetupID:        testDBOpts.SetupID,
	Setup:          testDBOpts.Setup,
	SkipMigrations: true,
}

type testBundle struct {
	db     *atomicphasetest.DB
	runner *atomicphase.Runner
	ctx    context.Context
}

// setup gives the test a migrated database of its own and a Runner on it.
func setup(t *testing.T, cfg *atomicphase.Config) *testBundle {
	t.Helper()
	return setupDB(t, testDBOpts, cfg)
}

// setupDB is setup with a database made from dbOpts (unmigratedDBOpts, say).
// NewRunner does not touch the database, so the Runner exists even when the
// schema does not.
func setupDB(t *testing.T, dbOpts *atomicphasetest.Options, cfg *atomicphase.Config) *testBundle {
	t.Helper()
	db := atomicphasetest.NewDB(t, dbOpts)
	runner, err := atomicphase.NewRunner(db.Pool, cfg)
	require.NoError(t, err)
	return &testBundle{db: db, runner: runner, ctx: context.Background()}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// orderInput is what an order request carries.
type orderInput struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

func startOrder(in orderInput, _ *atomicphase.Request) (orderState, error) {
	return orderState{Item: in.Item, Quantity: in.Quantity}, nil
}

// orderState is the state of the three-phase test workflow.
type orderState struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
	OrderID  int64  `json:"order_id,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
}

// counters count phase invocations of the three-phase workflow.
type counters struct{ create, charge, finish atomic.Int32 }

// hooks let a test intervene inside a phase of orderWorkflow.
type hooks struct {
	// afterCreate runs in the create phase's transaction after its insert.
	afterCreate func(ctx context.Context, tx pgx.Tx) error
	charge      func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error
	finish      func(ctx context.Context, tx pgx.Tx, s *orderState) error
}

// orderWorkflow is create (local) → charge (foreign) → finish (responds).
func orderWorkflow(t testing.TB, c *counters, h hooks) *atomicphase.Workflow[orderState] {
	t.Helper()
	wf, err := atomicphase.NewWorkflow("order", startOrder, []atomicphase.Phase[orderState]{
		atomicphase.Local("create", func(ctx context.Context, tx atomicphase.Tx, s *orderState) (atomicphase.Outcome, error) {
			c.create.Add(1)
			if err := tx.QueryRow(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('', '', 'create', $1) RETURNING id`, s.Item).Scan(&s.OrderID); err != nil {
				return atomicphase.Outcome{}, err
			}
			if h.afterCreate != nil {
				return atomicphase.Outcome{}, h.afterCreate(ctx, tx)
			}
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
			c.charge.Add(1)
			if h.charge != nil {
				return h.charge(ctx, call, s)
			}
			return call.Do(ctx, func(ctx context.Context, key string) error {
				s.ChargeID = "ch_" + key
				return nil
			})
		}, nil),
		atomicphase.Local("finish", func(ctx context.Context, tx atomicphase.Tx, s *orderState) (atomicphase.Outcome, error) {
			c.finish.Add(1)
			if h.finish != nil {
				if err := h.finish(ctx, tx, s); err != nil {
					return atomicphase.Outcome{}, err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('', '', 'finish', $1)`, s.ChargeID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body := []byte(`{"order_id":` + strconv.FormatInt(s.OrderID, 10) + `,"charge_id":"` + s.ChargeID + `"}`)
			return atomicphase.Respond(201, body).WithHeader("Location", "/orders/"+strconv.FormatInt(s.OrderID, 10)), nil
		}),
	}, nil)
	require.NoError(t, err)
	return wf
}

func orderRequest(scope, key string) atomicphase.Request {
	return atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/orders",
		Params: []byte(`{"item": "rocket", "quantity": 1}`)}
}

// startEmpty starts a workflow that takes no input with the zero state.
func startEmpty[S any](struct{}, *atomicphase.Request) (S, error) {
	var s S
	return s, nil
}

// noop is a local phase that continues.
func noop(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
	return atomicphase.Continue(), nil
}

// respondOK is a one-phase workflow's phase: it responds 200 "ok".
func respondOK(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
	return atomicphase.Respond(200, []byte("ok")), nil
}

// seen records what the downstream of a test received.
type seen struct {
	mu   sync.Mutex
	keys []string
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
		}, func(ctx context.Context, tx atomicphase.Tx, s *shopState) (atomicphase.Outcome, error) {
			if s.Declined != "" {
				return atomicphase.Respond(402, []byte(s.Declined)), nil
			}
			return atomicphase.Respond(201, []byte(s.ChargeID)), nil
		}),
	}, nil)
}

// asRetry is req marked as its client's retry (Request.Retry), as aphttp's
// Client marks every attempt after its first: its key is read first, and
// a key that turns out to exist runs no phase function at all.
func asRetry(req atomicphase.Request) atomicphase.Request {
	req.Retry = true
	return req
}

// unmarkedReadsFirst reports whether a request not marked as a retry still
// reads its key in a round trip of its own, as a marked one does: on Citus
// (docs/scale.md) and in pgx's cache_describe mode (assume_prepare.go).
func unmarkedReadsFirst() bool {
	return atomicphasetest.OnCitus() || os.Getenv("ATOMICPHASE_TEST_EXEC_MODE") == "cache_describe"
}
