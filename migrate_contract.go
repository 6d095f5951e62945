package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
	"github.com/jackc/pgx/v5"
)

// Contract steps: a migration that removes what only an older release
// reads is marked in its SQL, applied by Migrate only when asked (or on a
// database migrated from nothing), and refused while a process of such a
// release may still run, as the versions registry tells
// (docs/operations.md, "Which releases are live").

// ErrOlderReleaseLive is Migrate's error for a contract step while a
// process of a release older than the step allows may still run: seen by
// the versions registry within MigrateOpts.LiveWithin.
var ErrOlderReleaseLive = errors.New("a process of an older release may still be running")

// contractMark marks a contract step in its up SQL, with the oldest
// migration a release may need to keep working after it.
var contractMark = regexp.MustCompile(`(?m)^-- atomicphase:contract needs=(\d+)\r?$`)

// ledgerEmpty reports whether the ledger in schema records no migration
// (or does not exist).
func ledgerEmpty(ctx context.Context, db Beginner, schema string) (bool, error) {
	q, ok := db.(keystore.DB)
	if !ok {
		return false, nil
	}
	var exists bool
	ledger := keystore.Render("/* TEMPLATE: schema */atomicphase_migration", schema)
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ledger).Scan(&exists); err != nil || !exists {
		return !exists, err
	}
	var any bool
	err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+ledger+")").Scan(&any)
	return !any, err
}

// checkNoOlderRelease refuses contract step m, unless it is applied
// already, while the versions registry has seen a process of a release
// that needs a migration before m.Needs within opts.LiveWithin.
func checkNoOlderRelease(ctx context.Context, db Beginner, opts *MigrateOpts, m Migration) error {
	q, ok := db.(keystore.DB)
	if !ok {
		return fmt.Errorf("a contract step reads the versions registry first: pass Migrate a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx, not a %T", db)
	}
	if done, err := inLedger(ctx, q, opts.schema(), m); done || err != nil {
		return err
	}
	window := DefaultVersionHorizon
	if opts != nil && opts.LiveWithin > 0 {
		window = opts.LiveWithin
	}
	seen, err := keystore.OlderReleaseSeen(ctx, q, opts.schema(), m.Needs, window)
	if err != nil {
		return fmt.Errorf("read the versions registry: %w", err)
	}
	if seen.IsZero() {
		return nil
	}
	return fmt.Errorf("%w: it removes what a release older than one needing migration %03d reads, and a process of such a release "+
		"was last seen %s ago (%s), within MigrateOpts.LiveWithin (%s); apply it once every such process has stopped and that long has passed "+
		"(a process is seen at each sweep, or when it records its versions if it runs no Sweeper)",
		ErrOlderReleaseLive, m.Needs, time.Since(seen).Round(time.Second), seen.UTC().Format(time.RFC3339), window)
}

// PendingMigrations returns the migrations the database in opts.Schema
// has not applied, in order: after Migrate without MigrateOpts.Contract,
// the contract steps it left (Migration.Contract) for a run that asks. It
// reads the ledger only; db is what Migrate takes.
func PendingMigrations(ctx context.Context, db Beginner, opts *MigrateOpts) ([]Migration, error) {
	migrations, err := Migrations(opts)
	if err != nil {
		return nil, err
	}
	q, ok := db.(keystore.DB)
	if !ok {
		return nil, fmt.Errorf("atomicphase: PendingMigrations reads the ledger: pass a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx, not a %T", db)
	}
	var exists bool
	ledger := keystore.Render("/* TEMPLATE: schema */atomicphase_migration", opts.schema())
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ledger).Scan(&exists); err != nil || !exists {
		return migrations, err
	}
	rows, err := q.Query(ctx, "SELECT version FROM "+ledger)
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(migrations, func(m Migration) bool { return slices.Contains(versions, int32(m.Version)) }), nil
}
