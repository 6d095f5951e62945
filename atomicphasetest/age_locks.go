package atomicphasetest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// AgeLocks moves every held lock in the database back by lockTimeout, so the
// next attempt finds it stale and takes it over through the ordinary
// acquisition path, and ends every foreign call's quiet period and every
// reconciliation's backoff: the passage of time after a crash, or a
// client's wait for its Retry-After, without the wait.
// On Citus the statement goes to every shard, as it means to.
func AgeLocks(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, lockTimeout time.Duration) error {
	return keystore.AgeLocks(ctx, db, "", lockTimeout)
}
