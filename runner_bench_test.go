package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// Run with: make bench (go test -run '^$' -bench . -benchmem).

func benchSetup(b *testing.B) (*atomicphase.Runner, *atomicphase.Workflow[orderState], *pgxpool.Pool) {
	b.Helper()
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) { cfg.MaxConns = 16 }
	db := atomicphasetest.NewDB(b, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	var c counters
	wf := orderWorkflow(b, &c, hooks{})
	return runner, wf, db.Pool
}

// benchFinishedKey finishes the key u/k, then runs op in parallel: the
// replay-shaped benchmarks differ only in op.
func benchFinishedKey(b *testing.B, op func(ctx context.Context, runner *atomicphase.Runner, wf *atomicphase.Workflow[orderState], pool *pgxpool.Pool) error) {
	runner, wf, pool := benchSetup(b)
	ctx := context.Background()
	if _, err := runner.Run(ctx, wf, orderRequest("u", "k")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(ctx, runner, wf, pool); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplay answers a finished key: the acquisition statement's
// replay path, one round trip, no write.
func BenchmarkReplay(b *testing.B) {
	benchFinishedKey(b, func(ctx context.Context, runner *atomicphase.Runner, wf *atomicphase.Workflow[orderState], _ *pgxpool.Pool) error {
		resp, err := runner.Run(ctx, wf, orderRequest("u", "k"))
		if err == nil && !resp.Replayed {
			err = errors.New("not a replay")
		}
		return err
	})
}

// BenchmarkPrimaryKeySelect is the floor a replay is measured against: a
// primary-key lookup of the same row returning the same columns.
func BenchmarkPrimaryKeySelect(b *testing.B) {
	benchFinishedKey(b, func(ctx context.Context, _ *atomicphase.Runner, _ *atomicphase.Workflow[orderState], pool *pgxpool.Pool) error {
		var status int
		var body []byte
		return pool.QueryRow(ctx, `SELECT response_status, response_body FROM idempotency_keys
			WHERE scope = $1 AND idempotency_key = $2`, "u", "k").Scan(&status, &body)
	})
}

// BenchmarkNaiveUpsertReplay is the shape acquisition avoids: a plain
// INSERT ... ON CONFLICT DO UPDATE ... RETURNING, which builds a tuple and
// writes a new row version on every replay.
func BenchmarkNaiveUpsertReplay(b *testing.B) {
	benchFinishedKey(b, func(ctx context.Context, _ *atomicphase.Runner, _ *atomicphase.Workflow[orderState], pool *pgxpool.Pool) error {
		var status *int
		var body []byte
		return pool.QueryRow(ctx, `INSERT INTO idempotency_keys AS k
				(scope, idempotency_key, workflow, fingerprint, request_method, request_path, state)
			VALUES ($1, $2, 'order', '\x00', 'POST', '/orders', '{}')
			ON CONFLICT (scope, idempotency_key) DO UPDATE SET updated_at = k.updated_at
			RETURNING response_status, response_body`, "u", "k").Scan(&status, &body)
	})
}

// BenchmarkRunNewKey runs the three-phase workflow (local, foreign, local)
// for a new key each time: 6 round trips and 3 commits.
func BenchmarkRunNewKey(b *testing.B) {
	for _, perCPU := range []int{1, 4} {
		b.Run(fmt.Sprintf("goroutines=%d", perCPU*runtime.GOMAXPROCS(0)), func(b *testing.B) {
			runner, wf, _ := benchSetup(b)
			ctx := context.Background()
			var seq atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(perCPU)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := fmt.Sprintf("key-%d", seq.Add(1))
					if _, err := runner.Run(ctx, wf, orderRequest("u", key)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkAcquireNewKeyCapped records a new key through the acquisition
// statement (atomicphase_admit), under a cap on unfinished keys per scope,
// which counts parked keys too, with ten parked keys in the scope: one
// round trip per key, the workflow a one-phase respond.
func BenchmarkAcquireNewKeyCapped(b *testing.B) {
	db := atomicphasetest.NewDB(b, testDBOpts)
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{MaxUnfinishedPerScope: 1000})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	type st = struct{}
	parks := atomicphase.MustWorkflow("parks", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("parked for the benchmark"))
		}),
	}, nil)
	for i := range 10 {
		_, _ = runner.Run(ctx, parks, atomicphase.Request{Scope: "u", Key: fmt.Sprint("parked-", i), Method: "POST", Path: "/p"})
	}
	wf := atomicphase.MustWorkflow("respond", startEmpty[st], []atomicphase.Phase[st]{atomicphase.Local("r", respondOK)}, nil)
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		key := fmt.Sprintf("key-%d", seq.Add(1))
		if _, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: key, Method: "POST", Path: "/r"}); err != nil {
			b.Fatal(err)
		}
	}
}
