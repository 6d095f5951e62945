package atomicphase_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// shopDBOpts adds a catalogue and orders that refer to it, and a CHECK on
// the quantity, to the test database.
var shopDBOpts = &atomicphasetest.Options{
	SetupID: "core-tests-shop-v1",
	Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := testDBOpts.Setup(ctx, pool); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `
			CREATE TABLE products (scope text NOT NULL, id bigint NOT NULL, PRIMARY KEY (scope, id));
			CREATE TABLE orders (
				scope      text NOT NULL,
				id         bigserial,
				product_id bigint NOT NULL,
				quantity   int NOT NULL CHECK (quantity > 0),
				PRIMARY KEY (scope, id),
				FOREIGN KEY (scope, product_id) REFERENCES products (scope, id));
			INSERT INTO products VALUES ('u', 1)`)
		return err
	},
	Distribute: map[string]string{"effects": "scope", "products": "scope", "orders": "scope"},
}

type buyIn struct {
	Product  int64 `json:"product"`
	Quantity int   `json:"quantity"`
}

// buyWorkflow inserts an order for the request's product and quantity and
// responds 201; runs counts the phase's runs.
func buyWorkflow(runs *int, fkRetries int) *atomicphase.Workflow[buyIn] {
	place := atomicphase.Local("place", func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
		*runs++
		if _, err := tx.Exec(ctx, `INSERT INTO orders (scope, product_id, quantity) VALUES ('u', $1, $2)`, s.Product, s.Quantity); err != nil {
			return atomicphase.Outcome{}, fmt.Errorf("place order: %w", err)
		}
		return atomicphase.Respond(201, []byte("ordered")), nil
	})
	if fkRetries > 0 {
		place = place.WithForeignKeyRetries(fkRetries)
	}
	return atomicphase.MustWorkflow("buy", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil },
		[]atomicphase.Phase[buyIn]{place}, nil)
}

func buyRequest(key string, product int64, quantity int) atomicphase.Request {
	return atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/orders",
		Params: []byte(fmt.Sprintf(`{"product":%d,"quantity":%d}`, product, quantity))}
}

// A body naming a product that does not exist breaks a foreign key on
// every retry: the first answer is a 422, stored, and every retry replays
// it byte for byte without running the phase again. Before, each of 30
// retries answered 503 and ran the phase, even once the key was parked.
func TestForeignKeyViolationIsAFinal422(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, &atomicphase.Config{MaxAttempts: 25})
	runs := 0
	wf := buyWorkflow(&runs, 0)
	req := buyRequest("k", 999, 1)
	first, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err, "the refusal is the request's answer, not a failure")
	require.Equal(t, 422, first.Status)
	require.Equal(t, "application/problem+json", first.Header.Get("Content-Type"))
	var problem map[string]any
	require.NoError(t, json.Unmarshal(first.Body, &problem))
	require.Equal(t, atomicphase.ProblemInvalidData, problem["type"])
	require.Equal(t, "23503", problem["sqlstate"])
	if !atomicphasetest.OnCitus() { // a worker's error reaches the client without the table's name
		require.Equal(t, "orders", problem["table"])
	}
	for i := range 30 {
		// Half of them marked as retries (Request.Retry): those run no
		// phase; the others' first unit is built and dropped unsent.
		retry := req
		retry.Retry = i%2 == 0
		resp, err := b.runner.Run(b.ctx, wf, retry)
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		require.Equal(t, 422, resp.Status)
		require.Equal(t, first.Body, resp.Body)
	}
	if unmarkedReadsFirst() {
		// Every request reads its key first here (unmarkedReadsFirst).
		require.Equal(t, 1, runs, "the phase ran once")
	} else {
		require.Equal(t, 1+15, runs, "the phase ran once, and was built by each unmarked retry")
	}
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Zero(t, b.count(t, `SELECT count(*) FROM orders`))
}

// A phase that declares a foreign-key violation a race worth retrying
// gets transient failures for the attempts it asked for, then the final
// 422; a product created in between is ordered.
func TestForeignKeyRetriesAreBounded(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, nil)
	runs := 0
	wf := buyWorkflow(&runs, 2)
	for i := range 2 {
		req := buyRequest("late", 7, 1)
		req.Retry = i > 0
		_, err := b.runner.Run(b.ctx, wf, req)
		require.Error(t, err, "attempt %d", i+1)
		require.True(t, atomicphase.Retryable(err), "attempt %d: a race worth retrying", i+1)
	}
	resp, err := b.runner.Run(b.ctx, wf, asRetry(buyRequest("late", 7, 1)))
	require.NoError(t, err)
	require.Equal(t, 422, resp.Status, "past its bound, the violation is final")
	require.Equal(t, 3, runs)

	_, err = b.runner.Run(b.ctx, wf, buyRequest("race", 8, 1))
	require.True(t, atomicphase.Retryable(err))
	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO products VALUES ('u', 8)`)
	require.NoError(t, err)
	resp, err = b.runner.Run(b.ctx, wf, buyRequest("race", 8, 1))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders WHERE product_id = 8`))
}

// A body that breaks a CHECK constraint is the client's mistake: 422,
// stored, nothing parked and nothing left unfinished, so a client cannot
// mint parked keys (before: 20 requests under a cap of 2 left 20 parked
// keys, answered 500).
func TestCheckViolationParksNothing(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, &atomicphase.Config{MaxUnfinishedPerScope: 2})
	runs := 0
	wf := buyWorkflow(&runs, 0)
	for i := range 20 {
		resp, err := b.runner.Run(b.ctx, wf, buyRequest(fmt.Sprint("bad-", i), 1, 0))
		require.NoError(t, err)
		require.Equal(t, 422, resp.Status)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE parked_at IS NOT NULL`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL`))
	require.Equal(t, 20, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE response_status = 422`))
	resp, err := b.runner.Run(b.ctx, wf, buyRequest("good", 1, 1))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
}

// chargeThenReceiptWorkflow charges a fake bank (charges counts the
// distinct downstream keys it was sent) in a foreign phase, then inserts
// the order in a local phase, whose CHECK refuses a quantity below 1.
func chargeThenReceiptWorkflow(charges map[string]int, fused bool) *atomicphase.Workflow[buyIn] {
	return atomicphase.MustWorkflow("charge-receipt", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil },
		[]atomicphase.Phase[buyIn]{
			atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *buyIn) error {
				return call.Do(ctx, func(ctx context.Context, key string) error {
					charges[key]++
					return nil
				})
			}, nil),
			atomicphase.Local("receipt", func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO orders (scope, product_id, quantity) VALUES ('u', $1, $2)`, s.Product, s.Quantity); err != nil {
					return atomicphase.Outcome{}, fmt.Errorf("receipt: %w", err)
				}
				return atomicphase.Respond(201, []byte("ordered")), nil
			}),
		}, &atomicphase.WorkflowOpts{CommitEachPhase: !fused})
}

// A data refusal after a foreign phase committed is no answer to send the
// client: the charge is made, and a 422 telling it to correct the request
// and send it with a new key had it charged twice. The key parks instead,
// with the refusal as its error, and every retry is answered ErrParked;
// the charge stays recorded, and nothing is stored as the key's answer.
// (Nothing that may have paid is forgotten.)
func TestDataRefusalAfterAForeignPhaseParks(t *testing.T) {
	t.Parallel()
	for _, fused := range []bool{false, true} {
		t.Run(fmt.Sprintf("fused=%v", fused), func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, shopDBOpts, nil)
			charges := map[string]int{}
			wf := chargeThenReceiptWorkflow(charges, fused)
			req := buyRequest("order-1", 1, 0) // quantity 0 breaks the CHECK
			resp, err := b.runner.Run(b.ctx, wf, req)
			require.Nil(t, resp, "no answer tells the client to send the request again")
			var pe *atomicphase.PhaseError
			require.ErrorAs(t, err, &pe)
			require.True(t, pe.Parked, "the key parks: %v", err)
			require.Equal(t, "receipt", pe.Phase)
			require.ErrorContains(t, err, "23514", "the refusal is the parked key's error")
			require.False(t, atomicphase.Retryable(err))

			_, err = b.runner.Run(b.ctx, wf, req)
			require.ErrorIs(t, err, atomicphase.ErrParked, "a retry is answered parked, not 422")
			info, err := b.runner.Inspect(b.ctx, "u", "order-1")
			require.NoError(t, err)
			require.Equal(t, atomicphase.KeyParked, info.Status)
			require.Equal(t, "charge", info.RecoveryPoint, "the charge stays recorded")
			require.Len(t, charges, 1, "one charge")
			require.Zero(t, b.count(t, `SELECT count(*) FROM orders`))
		})
	}
}

// Before any foreign phase committed, a data refusal is still the
// request's own 422 answer: nothing was paid, so a corrected request
// under a new key is what the client should send.
func TestDataRefusalBeforeAForeignPhaseStays422(t *testing.T) {
	t.Parallel()
	b := setupDB(t, shopDBOpts, nil)
	charges := map[string]int{}
	wf := atomicphase.MustWorkflow("receipt-charge", func(in buyIn, _ *atomicphase.Request) (buyIn, error) { return in, nil },
		[]atomicphase.Phase[buyIn]{
			atomicphase.Local("order", func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
				_, err := tx.Exec(ctx, `INSERT INTO orders (scope, product_id, quantity) VALUES ('u', $1, $2)`, s.Product, s.Quantity)
				return atomicphase.Outcome{}, err
			}),
			atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *buyIn) error {
				return call.Do(ctx, func(ctx context.Context, key string) error { charges[key]++; return nil })
			}, func(ctx context.Context, tx atomicphase.Tx, s *buyIn) (atomicphase.Outcome, error) {
				return atomicphase.Respond(201, []byte("ordered")), nil
			}),
		}, nil)
	resp, err := b.runner.Run(b.ctx, wf, buyRequest("order-0", 1, 0))
	require.NoError(t, err)
	require.Equal(t, 422, resp.Status)
	require.Empty(t, charges)
}
