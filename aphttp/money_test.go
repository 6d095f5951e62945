package aphttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// The money edges, as a client sees them: no answer leads a client that
// follows it to pay twice.

// bank counts the charges it took, by downstream key.
type bank struct {
	mu      sync.Mutex
	charges map[string]int
}

func (b *bank) charge(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.charges == nil {
		b.charges = map[string]int{}
	}
	b.charges[key]++
}

func (b *bank) distinct() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.charges)
}

type order struct {
	Quantity int `json:"quantity"`
}

// ordersDB has an orders table whose CHECK refuses a quantity below 1.
var ordersDB = &atomicphasetest.Options{
	SetupID: "aphttp-orders-v1",
	Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, `CREATE TABLE orders (scope text NOT NULL, id bigserial, quantity int NOT NULL CHECK (quantity > 0), PRIMARY KEY (scope, id))`)
		return err
	},
	Distribute: map[string]string{"orders": "scope"},
}

// serve serves POST /orders with wf through the middleware, scoped by
// X-User.
func serve(t *testing.T, runner *atomicphase.Runner, wf atomicphase.AnyWorkflow) *httptest.Server {
	t.Helper()
	o := aphttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }}
	srv := httptest.NewServer(aphttp.Middleware(runner, wf, &o)(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, data}
}

// A client that does what every answer says: a 422 invalid-data is
// corrected and sent with a new key; a parked key is not sent again. A
// data refusal after the charge committed answered 422 before, and the
// corrected request under a new key charged a second time; now the key
// parks, the client is answered 500 parked, and the bank holds one charge.
func TestHTTPDataRefusalAfterAChargeParks(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, ordersDB)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	var bk bank
	wf := atomicphase.MustWorkflow("order", func(in order, _ *atomicphase.Request) (order, error) { return in, nil },
		[]atomicphase.Phase[order]{
			atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, o *order) error {
				return call.Do(ctx, func(ctx context.Context, key string) error { bk.charge(key); return nil })
			}, nil),
			atomicphase.Local("receipt", func(ctx context.Context, tx atomicphase.Tx, o *order) (atomicphase.Outcome, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO orders (scope, quantity) VALUES ('alice', $1)`, o.Quantity); err != nil {
					return atomicphase.Outcome{}, err
				}
				return atomicphase.Respond(201, []byte(`{"ok":true}`)), nil
			}),
		}, nil)
	srv := serve(t, runner, wf)

	// The client: follow each answer, at most 5 requests.
	key, body := "order-1", `{"quantity":0}`
	for i := 0; i < 5; i++ {
		r := post(t, srv, key, body)
		var p aphttp.Problem
		_ = json.Unmarshal(r.body, &p)
		if r.status == http.StatusUnprocessableEntity && p.Type == atomicphase.ProblemInvalidData {
			key, body = fmt.Sprintf("order-1-corrected-%d", i), `{"quantity":0}` // still refused by the buggy phase
			continue
		}
		// The attempt that parks the key answers permanent-failure,
		// every retry parked: both say that sending it again changes
		// nothing until an operator acts.
		requireProblem(t, r, http.StatusInternalServerError, aphttp.ProblemPermanentFailure)
		r = post(t, srv, key, body)
		requireProblem(t, r, http.StatusInternalServerError, aphttp.ProblemParked)
		break
	}
	require.Equal(t, 1, bk.distinct(), "one charge for one order")
	var parked int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE parked_at IS NOT NULL AND recovery_point = 'charge'`).Scan(&parked))
	require.Equal(t, 1, parked, "the key is parked with the charge recorded")
}
