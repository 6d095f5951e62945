package atomicphasetest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Dropping a test's database on a Citus node.

// dropOn drops database name through admin. A session that is still
// closing (a coordinator's connection to a worker, a maintenance daemon
// starting) can make even a forced drop fail for a moment: it tries again.
// A transaction a killed process left prepared (the second phase of a
// commit across nodes that never came) keeps even a forced drop out for
// good: it is rolled back first.
func dropOn(ctx context.Context, admin *pgxpool.Pool, name string) error {
	drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	for {
		_, err := admin.Exec(ctx, drop)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.ObjectInUse {
			return err
		}
		if strings.Contains(pgErr.Message, "prepared transaction") {
			if rerr := rollbackPrepared(ctx, admin, name); rerr != nil {
				return errors.Join(err, rerr)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rollbackPrepared rolls back every transaction left prepared in database
// name on admin's node (ROLLBACK PREPARED runs only in the transaction's
// own database).
func rollbackPrepared(ctx context.Context, admin *pgxpool.Pool, name string) error {
	cfg := admin.Config().ConnConfig.Copy()
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database()")
	if err != nil {
		return err
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, gid := range gids {
		if _, err := conn.Exec(ctx, "ROLLBACK PREPARED '"+strings.ReplaceAll(gid, "'", "''")+"'"); err != nil {
			return err
		}
	}
	return nil
}
