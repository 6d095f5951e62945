package atomicphase

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// A batch that assumes its key is new (WorkflowOpts.AssumeNewKeys) fails,
// on purpose, whenever the key exists: its claim raises and ends the
// batch's implicit transaction. pgx treats any failed batch as a sign that
// its statements' cached plans may be stale: it drops every statement of
// the batch from the connection's statement cache, and deallocates them
// on the server, so the next request on that connection spends a round
// trip deallocating and another preparing them again. A replay would
// cost three round trips, not one.
//
// Statements prepared by name (pgx.Conn.Prepare) are kept out of that
// cache, and out of its invalidation. So on a connection in pgx's default
// mode (QueryExecModeCacheStatement), every statement of such a batch is
// prepared by name before it is sent: once per connection and statement,
// a primary-key lookup in pgx's map afterwards. The texts are bounded per
// Runner (maxAssumedStatements), so that a workflow building its SQL text
// per request cannot fill the server's memory with prepared statements;
// past the bound, statements go through the cache as any other.

// maxAssumedStatements bounds the statement texts a Runner prepares by
// name for assumed batches, on each connection.
const maxAssumedStatements = 256

// assumedStatements are the statement texts a Runner prepares by name.
type assumedStatements struct {
	mu    sync.RWMutex
	texts map[string]bool
}

// newAssumedStatements returns the registry of a Runner whose pool runs in
// mode, or nil when the mode needs none: only QueryExecModeCacheStatement
// deallocates the statements of a failed batch (QueryExecModeCacheDescribe
// describes them again; the other modes cache nothing).
func newAssumedStatements(mode pgx.QueryExecMode) *assumedStatements {
	if mode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	return &assumedStatements{texts: map[string]bool{}}
}

// admit reports whether sql is prepared by name: it is when it was
// admitted before, or when the bound leaves room for it.
func (s *assumedStatements) admit(sql string) bool {
	s.mu.RLock()
	ok := s.texts[sql]
	full := len(s.texts) >= maxAssumedStatements
	s.mu.RUnlock()
	if ok || full {
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.texts) >= maxAssumedStatements {
		return s.texts[sql]
	}
	s.texts[sql] = true
	return true
}

// prepare prepares by name, on conn, every statement of b that admit
// admits. A statement the server refuses to prepare is left to the batch,
// which fails on it as it would have.
func (s *assumedStatements) prepare(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) {
	if s == nil {
		return
	}
	for _, q := range b.QueuedQueries {
		if s.admit(q.SQL) {
			_, _ = conn.Prepare(ctx, q.SQL, q.SQL)
		}
	}
}
