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
	for range 30 {
		resp, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
		require.True(t, resp.Replayed)
		require.Equal(t, 422, resp.Status)
		require.Equal(t, first.Body, resp.Body)
	}
	require.Equal(t, 1, runs, "the phase ran once")
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
		_, err := b.runner.Run(b.ctx, wf, buyRequest("late", 7, 1))
		require.Error(t, err, "attempt %d", i+1)
		require.True(t, atomicphase.Retryable(err), "attempt %d: a race worth retrying", i+1)
	}
	resp, err := b.runner.Run(b.ctx, wf, buyRequest("late", 7, 1))
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
