package keystore

import (
	"context"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
)

// A key's history (atomicphase_key_history, migration 019): what went
// wrong with it, written by the key table's trigger when something does,
// beside the key (on Citus, on its shard), and deleted with it.

// HistoryEntry is one row of a key's history.
type HistoryEntry struct {
	ID            int64
	At            time.Time
	Event         string
	StatusBefore  string
	Status        string
	RecoveryPoint string
	Attempt       int
	LockToken     int64
	Error         *string
}

const historySQL = `SELECT * FROM (
    SELECT id, at, event, status_before, status, recovery_point, attempt, lock_token, error
    FROM /* TEMPLATE: schema */atomicphase_key_history
    WHERE scope = $1::text AND idempotency_key = $2::text
    ORDER BY at DESC, id DESC
    LIMIT $3::integer) AS newest
ORDER BY at, id`

// History reads a key's newest limit events, oldest first. In time order:
// on Citus an event's id depends on the node its key's shard is on.
func (s *Store) History(ctx context.Context, db DB, scope, key string, limit int) ([]*HistoryEntry, error) {
	var rows []*HistoryEntry
	err := pgxscan.Select(ctx, db, &rows, s.sql.history, scope, key, limit)
	return rows, err
}
