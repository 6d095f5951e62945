package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/apcitus"
	"github.com/atomicphase/atomicphase/internal/benchkit"
)

// The request: POST /rides for a rider (the scope), a charge at the
// payment API, the charge recorded on the ride, an outbox row, the
// response stored.
const amount = 2000

// rider is a tenant: its email is the request's scope.
type rider struct {
	id       int64
	email    string
	customer string
}

func riders(n int) []rider {
	out := make([]rider, n)
	for i := range out {
		out[i] = rider{id: int64(i + 1), email: fmt.Sprintf("rider%06d@example.com", i+1), customer: fmt.Sprintf("cus_%06d", i+1)}
	}
	return out
}

// createRiders inserts the riders (a reference table on Citus).
func createRiders(ctx context.Context, admin *pgxpool.Pool, rs []rider) error {
	ids := make([]int64, len(rs))
	emails := make([]string, len(rs))
	customers := make([]string, len(rs))
	for i, r := range rs {
		ids[i], emails[i], customers[i] = r.id, r.email, r.customer
	}
	_, err := admin.Exec(ctx, `INSERT INTO users (id, email, customer) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])`, ids, emails, customers)
	return err
}

// rideInput is the request body.
type rideInput struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
}

type rideResponse struct {
	Key      string `json:"key"`
	ChargeID string `json:"charge_id"`
	Amount   int    `json:"amount"`
}

func rideBody(seq int) []byte {
	f := float64(seq%1000) / 1000
	return fmt.Appendf(nil, `{"origin_lat":%.4f,"origin_lon":%.4f,"target_lat":%.4f,"target_lon":%.4f}`, 37.7+f, -122.4, 37.8-f, -122.3)
}

// The statements both designs send, each about one rider's rows: on
// Citus, each routes to the rider's shard.
const (
	rideSQL = `INSERT INTO rides (rider, idempotency_key, user_id, origin_lat, origin_lon, target_lat, target_lon)
VALUES ($1, $2, $3, $4, $5, $6, $7)`
	chargeSQL = `UPDATE rides SET stripe_charge_id = $3 WHERE rider = $1 AND idempotency_key = $2`
	outboxSQL = `INSERT INTO outbox (rider, idempotency_key, topic, payload) VALUES ($1, $2, 'ride.charged', $3)`

	hwKeySQL      = `INSERT INTO hw_idempotency_keys (scope, idempotency_key, request_hash) VALUES ($1, $2, $3)`
	hwResponseSQL = `UPDATE hw_idempotency_keys SET response_status = $3, response_body = $4, finished_at = now()
WHERE scope = $1 AND idempotency_key = $2`
)

// handWritten is the minimal hand-written design that routes on Citus:
// the key and the ride in one pipelined transaction (a key recorded before
// fails it, and with it the ride), the charge, then one pipelined
// transaction for the charge's record, the outbox row and the response.
// (Recording the key and inserting the ride in one statement, a CTE, is
// not routable on Citus.)
func handWritten(ctx context.Context, pool *pgxpool.Pool, pay *benchkit.Payments, r *rider, key string, body []byte) error {
	var in rideInput
	if err := json.Unmarshal(body, &in); err != nil {
		return err
	}
	h := sha256.Sum256(append([]byte("POST /rides\n"), body...))
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(hwKeySQL, r.email, key, h[:])
	b.Queue(rideSQL, r.email, key, r.id, in.OriginLat, in.OriginLon, in.TargetLat, in.TargetLon)
	b.Queue("COMMIT")
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record key and ride: %w", err)
	}
	mark(ctx, func(t *timeline) *time.Time { return &t.first })
	mark(ctx, func(t *timeline) *time.Time { return &t.callStart })
	chargeID, err := pay.Charge(ctx, r.customer, "ride-charge/"+r.email+"/"+key, "", amount, "usd")
	mark(ctx, func(t *timeline) *time.Time { return &t.callEnd })
	if err != nil {
		return err
	}
	resp, err := json.Marshal(rideResponse{Key: key, ChargeID: chargeID, Amount: amount})
	if err != nil {
		return err
	}
	payload, err := json.Marshal(map[string]any{"email": r.email, "key": key, "charge_id": chargeID})
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(chargeSQL, r.email, key, chargeID)
	b.Queue(outboxSQL, r.email, key, string(payload))
	b.Queue(hwResponseSQL, r.email, key, http.StatusCreated, resp)
	b.Queue("COMMIT")
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record charge: %w", err)
	}
	return nil
}

// rideState is the atomicphase design's state.
type rideState struct {
	Key       string  `json:"key"`
	Email     string  `json:"email"`
	UserID    int64   `json:"user_id"`
	Customer  string  `json:"customer"`
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
	ChargeID  string  `json:"charge_id,omitempty"`
}

// rideWorkflow is the same request through atomicphase: a local phase
// that inserts the ride, with the key's recording; a foreign phase that
// charges, whose record step writes the rest and responds.
func rideWorkflow(byEmail map[string]*rider, pay *benchkit.Payments) *atomicphase.Workflow[rideState] {
	start := func(in rideInput, req *atomicphase.Request) (rideState, error) {
		r, ok := byEmail[req.Scope]
		if !ok {
			return rideState{}, fmt.Errorf("unknown rider %q", req.Scope)
		}
		return rideState{Key: req.Key, Email: r.email, UserID: r.id, Customer: r.customer,
			OriginLat: in.OriginLat, OriginLon: in.OriginLon, TargetLat: in.TargetLat, TargetLon: in.TargetLon}, nil
	}
	return atomicphase.MustWorkflow("create_ride", start, []atomicphase.Phase[rideState]{
		atomicphase.Local("create_ride", func(_ context.Context, tx atomicphase.Tx, r *rideState) (atomicphase.Outcome, error) {
			tx.Queue(rideSQL, r.Email, r.Key, r.UserID, r.OriginLat, r.OriginLon, r.TargetLat, r.TargetLon)
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, r *rideState) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				mark(ctx, func(t *timeline) *time.Time { return &t.callStart })
				id, err := pay.Charge(ctx, r.Customer, key, "", amount, "usd")
				mark(ctx, func(t *timeline) *time.Time { return &t.callEnd })
				r.ChargeID = id
				return err
			})
		}, func(_ context.Context, tx atomicphase.Tx, r *rideState) (atomicphase.Outcome, error) {
			payload, err := json.Marshal(map[string]any{"email": r.Email, "key": r.Key, "charge_id": r.ChargeID})
			if err != nil {
				return atomicphase.Outcome{}, err
			}
			tx.Queue(chargeSQL, r.Email, r.Key, r.ChargeID)
			tx.Queue(outboxSQL, r.Email, r.Key, string(payload))
			body, err := json.Marshal(rideResponse{Key: r.Key, ChargeID: r.ChargeID, Amount: amount})
			return atomicphase.Respond(http.StatusCreated, body), err
		}),
	}, nil)
}

// entry is one way in: the pools requests reach the database through.
type entry struct {
	name string
	// pool returns the pool a client's request for scope goes through.
	pool func(client int, scope string) *pgxpool.Pool
	// runner returns the Runner a client's requests go through.
	runner func(client int) *atomicphase.Runner
	wf     *atomicphase.Workflow[rideState]
	close  func()
}

// newEntry opens the pools and Runners of an entry mode on cluster c:
// "direct" (plain PostgreSQL), "coordinator", "any" (client i through
// worker i mod N) or "tenant" (each request through its rider's worker,
// by apcitus.Router).
func newEntry(ctx context.Context, c *cluster, mode string, clients int, wf *atomicphase.Workflow[rideState], diagnose bool) (*entry, error) {
	open := func(u string) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(clients)
		cfg.MinConns = 0
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	newRunner := func(p *pgxpool.Pool, router atomicphase.Router) (*atomicphase.Runner, error) {
		cfg := &atomicphase.Config{Router: router}
		if diagnose {
			cfg.Logger, cfg.Observer = slog.New(runnerLog), firstCommitObserver{}
		}
		r, err := atomicphase.NewRunner(p, cfg)
		if err != nil {
			return nil, err
		}
		if err := r.Register(wf); err != nil {
			return nil, err
		}
		return r, r.RecordVersions(ctx)
	}
	switch mode {
	case "direct", "coordinator":
		p, err := open(c.url(0))
		if err != nil {
			return nil, err
		}
		if err := fill(ctx, p, clients); err != nil {
			p.Close()
			return nil, err
		}
		r, err := newRunner(p, nil)
		if err != nil {
			p.Close()
			return nil, err
		}
		return &entry{name: mode, wf: wf, pool: func(int, string) *pgxpool.Pool { return p },
			runner: func(int) *atomicphase.Runner { return r }, close: p.Close}, nil
	case "any":
		// Each client's requests through one worker, whatever their
		// tenant: a Router that always answers that worker's pool. The
		// Runners' own pool, the coordinator's, records the versions.
		coord, err := open(c.url(0))
		if err != nil {
			return nil, err
		}
		pools := []*pgxpool.Pool{coord}
		closeAll := func() {
			for _, p := range pools {
				p.Close()
			}
		}
		var workers []*pgxpool.Pool
		var runners []*atomicphase.Runner
		for i := 1; i <= c.workers; i++ {
			p, err := open(c.url(i))
			if err != nil {
				closeAll()
				return nil, err
			}
			pools = append(pools, p)
			workers = append(workers, p)
			if err := fill(ctx, p, (clients+c.workers-1)/c.workers); err != nil {
				closeAll()
				return nil, err
			}
			r, err := newRunner(coord, onePool{p})
			if err != nil {
				closeAll()
				return nil, err
			}
			runners = append(runners, r)
		}
		return &entry{name: mode, wf: wf, pool: func(client int, _ string) *pgxpool.Pool { return workers[client%len(workers)] },
			runner: func(client int) *atomicphase.Runner { return runners[client%len(runners)] }, close: closeAll}, nil
	case "tenant":
		p, err := open(c.url(0))
		if err != nil {
			return nil, err
		}
		router, err := apcitus.NewRouter(ctx, p, &apcitus.Config{Refresh: -1})
		if err != nil {
			p.Close()
			return nil, err
		}
		for _, wp := range router.Pools() {
			if err := fill(ctx, wp, clients); err != nil {
				router.Close()
				p.Close()
				return nil, err
			}
		}
		r, err := newRunner(p, router)
		if err != nil {
			router.Close()
			p.Close()
			return nil, err
		}
		return &entry{name: mode, wf: wf, pool: func(_ int, scope string) *pgxpool.Pool { return router.Pool(scope) },
			runner: func(int) *atomicphase.Runner { return r }, close: func() { router.Close(); p.Close() }}, nil
	}
	return nil, fmt.Errorf("unknown entry mode %q", mode)
}

// fill opens n connections in p at once (up to its size) and keeps them
// idle: a connection opened during a measurement costs its request the
// connection's start (on a Citus worker, loading the metadata caches), and
// the design measured first in a mode would pay for the pool's growth.
func fill(ctx context.Context, p *pgxpool.Pool, n int) error {
	n = min(n, int(p.Config().MaxConns))
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.Acquire(ctx)
			if err == nil {
				// A first read of the key table: a Citus node loads its
				// metadata caches with its first distributed statement.
				_, err = c.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE scope = $1 AND idempotency_key = ''`, strconv.Itoa(i))
			}
			if err != nil {
				errs[i] = err
				if c != nil {
					c.Release()
				}
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// onePool is a Router that sends every scope to one pool.
type onePool struct{ p *pgxpool.Pool }

func (o onePool) Pool(string) *pgxpool.Pool { return o.p }
