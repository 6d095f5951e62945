package atomicphase_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// BenchmarkSweepRunOnce times one sweep over 10 000 finished keys and 100
// abandoned ones: it finds and completes the abandoned keys (one local
// phase each) and leaves the finished ones. keys/s is abandoned keys
// completed per second.
func BenchmarkSweepRunOnce(b *testing.B) {
	db := atomicphasetest.NewDB(b, nil)
	ctx := context.Background()
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(b, err)
	wf := atomicphase.MustWorkflow("bench_sweep", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("done", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	require.NoError(b, runner.Register(wf))
	const finished, abandoned = 10_000, 100
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
		                              recovery_point, response_status, response_body, finished_at, status)
		SELECT 'tenant_' || (i % 100), 'done-' || i, 'bench_sweep', '\x00', 'POST', '/', 'finished', 200, 'ok', now(), 'f'
		FROM generate_series(1, $1) AS i`, finished)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, status)
		SELECT 'tenant_' || (i % 100), 'open-' || i, 'bench_sweep', '\x00', 'POST', '/', '{}', 'w'
		FROM generate_series(1, $1) AS i`, abandoned)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE idempotency_keys`)
	require.NoError(b, err)
	sweeper, err := atomicphase.NewSweeper(runner, &atomicphase.SweepConfig{BatchSize: abandoned})
	require.NoError(b, err)

	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		_, err := db.Pool.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'started', response_status = NULL, status = 'w',
			response_body = NULL, finished_at = NULL, state = '{}', next_attempt_at = created_at
			WHERE idempotency_key LIKE 'open-%'`)
		require.NoError(b, err)
		b.StartTimer()
		start := time.Now()
		res, err := sweeper.RunOnce(ctx)
		total += time.Since(start)
		require.NoError(b, err)
		require.Equal(b, abandoned, res.Completed)
		require.Zero(b, res.Reaped)
	}
	b.ReportMetric(float64(abandoned*b.N)/total.Seconds(), "keys/s")
}

// BenchmarkReap times deleting 10 000 finished keys past their retention in
// batches of 1000.
func BenchmarkReap(b *testing.B) {
	db := atomicphasetest.NewDB(b, nil)
	ctx := context.Background()
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(b, err)
	const n = 10_000
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		_, err = db.Pool.Exec(ctx, `
			INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
			                              recovery_point, response_status, response_body, finished_at, status)
			SELECT 'tenant_' || (i % 100), 'done-' || i, 'w', '\x00', 'POST', '/', 'finished', 200, 'ok', now() - interval '2 days', 'f'
			FROM generate_series(1, $1) AS i`, n)
		require.NoError(b, err)
		b.StartTimer()
		start := time.Now()
		deleted, err := runner.Reap(ctx, 24*time.Hour, 1000, 100)
		total += time.Since(start)
		require.NoError(b, err)
		require.Equal(b, n, deleted)
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "keys/s")
}
