package atomicphase

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A batch that assumes its key is new (a request not marked as a retry) fails,
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
// a lookup in pgx's map afterwards. The texts are bounded per pool
// (maxAssumedStatements), so that a workflow building its SQL text per
// request cannot fill the server's memory with prepared statements; past
// the bound, statements go through the cache as any other. A batch that
// fails for any other reason than its key deallocates them (forgetNamed),
// as pgx's cache would.

// maxAssumedStatements bounds the statement texts a Runner prepares by
// name for assumed batches, on each connection.
const maxAssumedStatements = 256

// retryRefusedAfter is how long a statement the server refused to prepare
// is left to the batch before it is tried by name again: a table or
// function it names may be created meanwhile (a migration applied while
// the process runs).
const retryRefusedAfter = time.Minute

// assumedStatements are the statement texts a Runner prepares by name on
// one pool's connections: true for those it prepares, false for those the
// server refused to prepare (left to the batch, as pgx's cache has them,
// and tried again once retryRefusedAfter has passed since refusedAt).
type assumedStatements struct {
	mu        sync.RWMutex
	texts     map[string]bool
	refusedAt map[string]time.Time
	// now is the clock refusals are timed by (time.Now; a test's own).
	now func() time.Time
}

// newAssumedStatements returns an empty set of statement texts.
func newAssumedStatements() *assumedStatements {
	return &assumedStatements{texts: map[string]bool{}, refusedAt: map[string]time.Time{}, now: time.Now}
}

// assumeWay is how a pool's connections run a batch that assumes its key
// is new: not at all (the key is read first, as without the option), or
// with its statements prepared by name when named is not nil.
type assumeWay struct {
	ok    bool
	named *assumedStatements
}

// assumeWayFor returns how pool's connections run assumed batches, from
// its pgx query exec mode: QueryExecModeCacheStatement prepares their
// statements by name; QueryExecModeCacheDescribe runs none, since pgx
// forgets a failed batch's descriptions and describes them again in a
// round trip of its own (a replay would cost two); the other modes cache
// nothing, and run them as they are.
func (r *Runner) assumeWayFor(pool *pgxpool.Pool) assumeWay {
	if w, ok := r.assumeWays.Load(pool); ok {
		return w.(assumeWay)
	}
	var w assumeWay
	switch pool.Config().ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement:
		w = assumeWay{ok: true, named: newAssumedStatements()}
	case pgx.QueryExecModeCacheDescribe:
	default:
		w = assumeWay{ok: true}
	}
	actual, _ := r.assumeWays.LoadOrStore(pool, w)
	return actual.(assumeWay)
}

// admit reports whether sql is prepared by name: it is when it was
// admitted before, when the bound leaves room for it, or when its refusal
// is retryRefusedAfter old.
func (s *assumedStatements) admit(sql string) bool {
	s.mu.RLock()
	ok, seen := s.texts[sql]
	full := len(s.texts) >= maxAssumedStatements
	s.mu.RUnlock()
	if ok || (!seen && full) {
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok, seen := s.texts[sql]; ok || (!seen && len(s.texts) >= maxAssumedStatements) {
		return ok
	} else if seen && s.now().Sub(s.refusedAt[sql]) < retryRefusedAfter {
		return false
	}
	delete(s.refusedAt, sql)
	s.texts[sql] = true
	return true
}

// refuse notes that the server refused to prepare sql because of err, and
// reports whether it did: not when err says nothing of the statement
// itself (a lost connection, a cancelled or timed-out request, a lock not
// granted in time while a table is altered, an overloaded server). Such
// a statement is tried again by the next batch: a refusal would leave it
// to pgx's cache, whose invalidation by every replay's failed batch costs
// round trips, for retryRefusedAfter.
func (s *assumedStatements) refuse(sql string, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !refusesTheText(pgErr.Code) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.texts[sql] = false
	s.refusedAt[sql] = s.now()
	return true
}

// refusesTheText reports whether a server's error in preparing a statement
// is about its text, and would come back if tried again at once: a syntax
// error, or a name it uses that is not there (class 42; more than one
// statement in the text is a syntax error too), a schema it names that
// is not there (3F), a feature the server does not support (0A), a
// literal the server cannot read as its type (22), or a prepared
// statement's name the server will not take (26). A statement that an
// earlier one of its batch makes valid (a table it creates) fails so. Any
// other error is taken for one that may not come back.
func refusesTheText(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "42", "3F", "0A", "22", "26":
		return true
	}
	return false
}

// prepare prepares by name, on conn, every statement of b that admit
// admits, and returns their texts. A statement the server refuses to
// prepare is left to the batch, which fails on it as it would have. A
// failure that says nothing of the text ends the preparation there: the
// batch goes as it is, and its own result is the unit's (each statement
// after would wait out the same lock or timeout, or fail on the same lost
// connection, before the batch does).
func (s *assumedStatements) prepare(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) []string {
	if s == nil {
		return nil
	}
	var named []string
	for _, q := range b.QueuedQueries {
		if !s.admit(q.SQL) {
			continue
		}
		if _, err := conn.Prepare(ctx, q.SQL, q.SQL); err != nil {
			if !s.refuse(q.SQL, err) {
				break
			}
			continue
		}
		named = append(named, q.SQL)
	}
	return named
}

// forgetNamed deallocates the statements prepared by name for the batch
// that failed, unless it failed on its claim's refusal: a statement
// prepared by name is never prepared again by pgx, so one the server lost
// (DEALLOCATE ALL) or whose plan went stale (a column added: "cached plan
// must not change result type") would fail every later batch on the
// connection. Prepared again by the next batch that needs it, as pgx's
// cache does after any failed batch. Best effort: a connection that broke
// is discarded by the pool anyway.
func (t *phaseTx) forgetNamed(ctx context.Context) {
	for _, sql := range t.named {
		_ = t.conn.Deallocate(ctx, sql)
	}
	t.named = nil
}
