package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// tracer counts, on one design's pool, the round trips and the commits its
// requests cost, and which round trips were batches. It is a pgx tracer
// (query, batch and prepare):
//
//   - a round trip is a Query, QueryRow or Exec (one TraceQueryStart), a
//     SendBatch (one TraceBatchStart, however many statements it carries;
//     a batch, too), or a Prepare that went to the server (pgx's statement
//     cache missed; none after the warm-up);
//   - a commit is a statement whose command tag is COMMIT (sent alone or in
//     a batch; a COMMIT of a failed transaction answers ROLLBACK and does
//     not count), or a statement that writes (INSERT, UPDATE, DELETE or MERGE
//     tags) outside a transaction block, which commits on its own: a
//     statement sent alone that leaves the connection idle, or a batch
//     statement outside BEGIN … COMMIT, which commits with its batch's
//     implicit transaction (one commit per batch).
//
// A SELECT of a function that writes, outside a transaction block, commits
// too, and its command tag (SELECT) cannot tell: the tracer misses it. The
// server-side count of transaction ids (cellResult.xids) has no such blind
// spot, and the report shows both.
type tracer struct {
	trips       atomic.Int64
	commits     atomic.Int64
	batchesSent atomic.Int64

	// batches holds, per connection, whether the batch being read is
	// inside a transaction block and whether it wrote outside one. A
	// connection reads one batch at a time.
	batches sync.Map // *pgx.Conn → *batchState
}

// batchState is what the tracer knows of the batch a connection is
// reading.
type batchState struct {
	inBlock   bool
	autoWrite bool
}

var (
	_ pgx.QueryTracer   = (*tracer)(nil)
	_ pgx.BatchTracer   = (*tracer)(nil)
	_ pgx.PrepareTracer = (*tracer)(nil)
)

// counts is a snapshot of a tracer's counters.
type counts struct{ trips, commits, batches int64 }

// snapshot reads the tracer's counters.
func (t *tracer) snapshot() counts {
	return counts{trips: t.trips.Load(), commits: t.commits.Load(), batches: t.batchesSent.Load()}
}

// minus is what was counted between o and c.
func (c counts) minus(o counts) counts {
	return counts{trips: c.trips - o.trips, commits: c.commits - o.commits, batches: c.batches - o.batches}
}

// writes reports a command tag of a statement that changes data.
func writes(tag pgconn.CommandTag) bool {
	if tag.Insert() || tag.Update() || tag.Delete() {
		return true
	}
	return strings.HasPrefix(tag.String(), "MERGE")
}

// TraceQueryStart counts a statement sent alone: a round trip.
func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.trips.Add(1)
	return ctx
}

// TraceQueryEnd counts a statement sent alone that committed.
func (t *tracer) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err != nil {
		return
	}
	// After a statement sent alone, an idle connection ('I') means no
	// transaction block is open: the statement committed by itself, or
	// was the COMMIT.
	if data.CommandTag.String() == "COMMIT" || (writes(data.CommandTag) && conn.PgConn().TxStatus() == 'I') {
		t.commits.Add(1)
	}
}

// TraceBatchStart counts a batch: a round trip.
func (t *tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.trips.Add(1)
	t.batchesSent.Add(1)
	st, ok := t.batches.Load(conn)
	if !ok {
		st, _ = t.batches.LoadOrStore(conn, &batchState{})
	}
	bs := st.(*batchState)
	// The connection's status before the batch: 'T' or 'E' inside a
	// transaction block a previous send opened.
	*bs = batchState{inBlock: conn.PgConn().TxStatus() != 'I'}
	return ctx
}

// TraceBatchQuery follows a batch's statements: a COMMIT commits, and
// a write outside a transaction block commits with the batch.
func (t *tracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	st, ok := t.batches.Load(conn)
	if !ok || data.Err != nil {
		return
	}
	bs := st.(*batchState)
	switch tag := data.CommandTag.String(); {
	case tag == "BEGIN":
		bs.inBlock = true
	case tag == "COMMIT":
		bs.inBlock = false
		t.commits.Add(1)
	case tag == "ROLLBACK":
		bs.inBlock = false
	case !bs.inBlock && writes(data.CommandTag):
		bs.autoWrite = true
	}
}

// TraceBatchEnd counts the commit of a batch's implicit transaction,
// when one of its statements wrote outside a transaction block.
func (t *tracer) TraceBatchEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	st, ok := t.batches.Load(conn)
	if !ok {
		return
	}
	if bs := st.(*batchState); bs.autoWrite && data.Err == nil {
		t.commits.Add(1) // the batch's implicit transaction
	}
}

// TracePrepareStart does nothing: TracePrepareEnd counts.
func (t *tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

// TracePrepareEnd counts a Prepare that went to the server: a round trip.
func (t *tracer) TracePrepareEnd(_ context.Context, _ *pgx.Conn, data pgx.TracePrepareEndData) {
	if !data.AlreadyPrepared {
		t.trips.Add(1)
	}
}
