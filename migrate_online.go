package atomicphase

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Online migrations. An index on a busy key table is built with CREATE
// INDEX CONCURRENTLY, which takes no lock that stops writes, and which
// PostgreSQL refuses inside a transaction. A migration whose up SQL begins
// with the line noTransaction is therefore applied outside one, a
// statement at a time, on one connection holding Migrate's advisory lock
// for the session. Its statements must be safe to run again (IF NOT
// EXISTS): a process killed halfway leaves the ledger without the
// migration, and the next Migrate runs it from the top. An index build that
// was interrupted leaves an invalid index behind, which IF NOT EXISTS would
// keep; it is dropped first and built again.

// noTransaction marks a migration applied outside a transaction.
const noTransaction = "-- atomicphase:no-transaction"

// online reports whether m is applied outside a transaction.
func online(m Migration) bool {
	return strings.HasPrefix(strings.TrimSpace(m.Up), noTransaction)
}

// concurrentIndex matches an idempotent concurrent index build and names
// the index.
var concurrentIndex = regexp.MustCompile(`(?is)^\s*(?:--[^\n]*\n\s*)*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+("[^"]+"|\w+)\s+ON\s+((?:"[^"]+"|\w+)\.)?`)

// applyOnline applies m outside a transaction (see online) unless the
// ledger in schema says it is applied, and reports whether it applied it.
func applyOnline(ctx context.Context, db Beginner, schema string, m Migration) (bool, error) {
	conn, release, err := sessionConn(ctx, db)
	if err != nil {
		return false, err
	}
	defer release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockID)); err != nil {
		return false, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLockID)) //nolint:errcheck // the session's end releases it too
	if done, err := inLedger(ctx, conn, schema, m); done || err != nil {
		return false, err
	}
	for _, stmt := range splitStatements(m.Up) {
		if err := dropInvalidIndex(ctx, conn, schema, stmt); err != nil {
			return false, err
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	return true, record(ctx, conn, schema, m)
}

// dropInvalidIndex drops the index stmt builds concurrently if an earlier,
// interrupted build left it invalid.
func dropInvalidIndex(ctx context.Context, conn *pgx.Conn, schema, stmt string) error {
	m := concurrentIndex.FindStringSubmatch(stmt)
	if m == nil {
		return nil
	}
	name := m[1]
	if m[2] != "" {
		name = m[2] + name // the index lives in its table's schema
	} else if schema != "" {
		name = pgx.Identifier{schema}.Sanitize() + "." + name
	}
	var invalid bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_index WHERE indexrelid = to_regclass($1) AND NOT indisvalid)`, name).Scan(&invalid)
	if err != nil || !invalid {
		return err
	}
	_, err = conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name)
	return err
}

// sessionConn returns a connection outside any transaction from db, and
// the function that gives it back.
func sessionConn(ctx context.Context, db Beginner) (*pgx.Conn, func(), error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return pc.Conn(), pc.Release, nil
	case *pgx.Conn:
		return d, func() {}, nil
	case *pgxpool.Conn:
		return d.Conn(), func() {}, nil
	}
	return nil, nil, fmt.Errorf("this migration builds indexes concurrently, which PostgreSQL cannot do inside a transaction: "+
		"pass Migrate a *pgxpool.Pool or a *pgx.Conn, not a %T", db)
}
