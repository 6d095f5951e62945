package atomicphase

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Citus. The key table is distributed by scope, and every function that
// writes it by its scope argument, colocated with it: each key then lives on
// the worker that holds its scope's shard, a function call made outside a
// transaction block runs there in one round trip, and the two called
// inside a phase's transaction (the recording and the checkpoint) are
// delegated there too (force_delegation), so a phase that writes only its
// scope's rows commits on one worker, without two-phase commit, and every
// lock time is taken by that worker's clock. docs/scale.md explains it all.

// CitusDistribution returns the statements that distribute the key table
// and its functions on a Citus coordinator, for schema ("" for the
// search_path), in order: what MigrateOpts.Citus runs after the migrations
// (skipping the first when the table is distributed already). Run them
// yourself after your own migration tool applied the migrations (and again
// after any migration that recreates a function). It applies the same rules
// to the schema name as Migrate, and renders nothing for a name they refuse.
func CitusDistribution(schema string) ([]string, error) {
	if err := checkSchemaName("schema", schema); err != nil {
		return nil, fmt.Errorf("atomicphase: CitusDistribution: %w", err)
	}
	return keystore.CitusDistribution(schema), nil
}

// ErrNoCitus is returned by Migrate with MigrateOpts.Citus on a database
// without the citus extension.
var ErrNoCitus = errors.New("atomicphase: MigrateOpts.Citus is set, but the database has no citus extension (CREATE EXTENSION citus on every node, and register the workers, first)")

// checkCitus returns ErrNoCitus unless the database has the citus
// extension.
func checkCitus(ctx context.Context, db Beginner) error {
	var citus bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&citus)
	})
	if err == nil && !citus {
		err = ErrNoCitus
	}
	return err
}
