package atomicphasetest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// AgeLocks moves every held lock in the database back by lockTimeout, so the
// next attempt finds it stale and takes it over through the ordinary
// acquisition path: the passage of time after a crash, without the wait.
// The arithmetic is done in UTC on timestamps without time zone, whose
// operators are immutable: Citus refuses a stable function (timestamptz
// minus interval is one) applied to a column in an UPDATE. On Citus the
// statement goes to every shard, as it means to.
func AgeLocks(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, lockTimeout time.Duration) error {
	_, err := db.Exec(ctx, `UPDATE idempotency_keys
		SET locked_at = (locked_at AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC'
		WHERE locked_at IS NOT NULL`, lockTimeout.Microseconds())
	return err
}
