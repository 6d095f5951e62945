package atomicphasetest

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer that counts the statements and batches sent.
// Once statements are prepared on a connection, each is one network round
// trip, so it measures what a workflow costs:
//
//	trips := &atomicphasetest.RoundTrips{}
//	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{PoolConfig: func(c *pgxpool.Config) {
//		c.ConnConfig.Tracer = trips
//	}})
type RoundTrips struct{ n atomic.Int64 }

// Count returns the round trips counted since the last Reset.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

// Reset sets the count to zero.
func (r *RoundTrips) Reset() { r.n.Store(0) }

// TraceQueryStart counts a Query, QueryRow or Exec.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch, which is sent in one round trip.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceBatchQuery does nothing.
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
