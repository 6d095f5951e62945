package atomicphase

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// ErrExecModeUnsafe means the pool reaches PostgreSQL through a pooler
// (PgBouncer in transaction pooling mode, say) with a pgx query exec mode
// that relies on a statement prepared in one transaction still being there
// in the next, on the same server connection: QueryExecModeCacheStatement
// (pgx's default) or QueryExecModeDescribeExec. Behind a transaction-pooling
// pooler the next transaction may run on another server connection, and
// statements fail with 42P05 (prepared statement already exists) or 26000
// (prepared statement does not exist), which park the keys that meet them.
// Runner.CheckSchema reports it at start-up; the error says which mode to
// use.
var ErrExecModeUnsafe = errors.New("atomicphase: the pool's query exec mode does not work through a transaction-pooling pooler")

// checkExecMode reports ErrExecModeUnsafe when the pool's exec mode keeps
// prepared statements between transactions and a pooler stands between
// the pool and the server. A pooler is told by the process id: the one a
// connection's start-up announced is the pooler's own invention, not that
// of the server process that runs its statements.
func (r *Runner) checkExecMode(ctx context.Context) error {
	mode := r.pool.Config().ConnConfig.DefaultQueryExecMode
	if mode != pgx.QueryExecModeCacheStatement && mode != pgx.QueryExecModeDescribeExec {
		return nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return storeError("check the exec mode", err)
	}
	defer conn.Release()
	pid, err := keystore.ServerPID(ctx, conn)
	if err != nil {
		return storeError("check the exec mode", err)
	}
	if pid == conn.Conn().PgConn().PID() {
		return nil
	}
	return fmt.Errorf("%w: the connection's process id (%d) is not the server's (%d), so a pooler stands in between, "+
		"and the exec mode %s prepares statements that the next transaction may not find on its server connection "+
		"(42P05, 26000); set the pool's DefaultQueryExecMode to pgx.QueryExecModeExec or pgx.QueryExecModeCacheDescribe "+
		"(default_query_exec_mode=exec in the connection string)",
		ErrExecModeUnsafe, conn.Conn().PgConn().PID(), pid, mode)
}
