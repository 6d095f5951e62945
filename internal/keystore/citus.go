package keystore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Citus. The key table is distributed by scope, and every function that
// writes it by its scope argument, colocated with it: each key then lives on
// the worker that holds its scope's shard, a function call made outside a
// transaction block runs there in one round trip, and the two called
// inside a phase's transaction (the recording and the checkpoint) are
// delegated there too (force_delegation), so a phase that writes only its
// scope's rows commits on one worker, without two-phase commit, and every
// lock time is taken by that worker's clock. docs/scale.md explains it all.

// citusFunctions are the functions distributed by their scope argument,
// and whether each is delegated inside a transaction block too.
var citusFunctions = []struct {
	signature string
	force     bool
	// optional: the library calls it only where it exists (Store.Features),
	// so CheckSchema does not look for it.
	optional bool
}{
	{"atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint, integer)", false, false},
	{"atomicphase_take(text, text, bigint, bigint, boolean)", false, false},
	{"atomicphase_release(text, text, bigint, text, bigint, boolean, boolean)", false, false},
	{"atomicphase_release(text, text, bigint, text, bigint, boolean, boolean, boolean)", false, false},
	{"atomicphase_release(text, text, bigint, text, bigint, boolean, boolean, boolean, boolean)", false, false},
	{"atomicphase_unpark(text, text)", false, false},
	{"atomicphase_schedule(text, text, boolean)", false, false},
	{`atomicphase_key_event(text, text, text, "char", "char", text, integer, bigint, text)`, false, false},
	{"atomicphase_record_resolution(text, text, boolean, text, bigint)", false, false},
	{"atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer)", false, false},
	{"atomicphase_record_verdict(text, text, boolean, text, bigint, jsonb)", false, false},
	{"atomicphase_renew(text, text, bigint, bigint, bigint)", false, false},
	{"atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer, text)", false, false},
	// Called inside the phase's transaction (phase fusion, the commit):
	// without force_delegation they would run on the coordinator.
	{"atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer)", true, false},
	{"atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint)", true, false},
	{"atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint, text)", true, false},
	{"atomicphase_checkpoint(text, text, bigint, text, text, bytea, integer, jsonb, bytea)", true, false},
	{"atomicphase_claim(text, text)", true, false},
	{"atomicphase_record_unit(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)", true, false},
	// Called at the head of a new key's first unit, inside its
	// transaction block, in place of the claim and the recording.
	{"atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)", true, true},
}

// unsafeTriggers lets the key table be distributed with its triggers
// (migration 019), which read and write only the row they fire for and
// its history, on its shard.
const unsafeTriggers = "SET citus.enable_unsafe_triggers = on"

// CitusDistribution returns the statements that distribute the key table,
// its history beside it, and its functions on a Citus coordinator, for
// schema ("" for the search_path), in order, to run in one session: what
// MigrateOpts.Citus runs after the migrations (skipping a table that is
// distributed already). Run them yourself after your own migration tool
// applied the migrations (and again after any migration that recreates a
// function). On a schema before migration 020, leave out the statement
// for atomicphase_record_first, which does not exist there yet.
func CitusDistribution(schema string) []string {
	table := quoteLiteral(qualifiedName(schema, "idempotency_keys"))
	stmts := []string{unsafeTriggers, fmt.Sprintf("SELECT create_distributed_table(%s, 'scope')", table),
		fmt.Sprintf("SELECT create_distributed_table(%s, 'scope', colocate_with := %s)",
			quoteLiteral(qualifiedName(schema, "atomicphase_key_history")), table)}
	for _, f := range citusFunctions {
		stmts = append(stmts, fmt.Sprintf(
			"SELECT create_distributed_function(%s, 'p_scope', colocate_with := %s, force_delegation := %t)",
			quoteLiteral(qualifiedName(schema, f.signature)), table, f.force))
	}
	return stmts
}

// qualifiedName is name qualified with schema, as regclass and
// regprocedure read it ("" leaves it to the search_path).
func qualifiedName(schema, name string) string {
	return Qualifier(schema) + name
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Beginner begins a transaction: a pool, a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DistributeOnCitus runs CitusDistribution(schema), distributing the table
// only when it is not distributed yet; create_distributed_function may be
// called again on a distributed function, and sets what it is told.
func DistributeOnCitus(ctx context.Context, db Beginner, schema string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// The tables first: each distributed already (migration 019
	// distributes the history of a key table distributed before it), or
	// not there (a schema before 019 has no history), is left out.
	var distributed [2]bool
	for i, name := range []string{"idempotency_keys", "atomicphase_key_history"} {
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NULL
			OR EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
			qualifiedName(schema, name)).Scan(&distributed[i]); err != nil {
			return err
		}
	}
	// A function already distributed as it should be is left alone, so
	// that processes starting together do not all rewrite its metadata;
	// so is an optional one the schema does not have yet (a migration
	// target before it).
	done := map[string]bool{}
	for _, f := range citusFunctions {
		var exists, ok bool
		if err := tx.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL, EXISTS (SELECT FROM pg_dist_object
			WHERE classid = 'pg_proc'::regclass AND objid = to_regprocedure($1)
			  AND distribution_argument_index = 0 AND colocationid = (
			      SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = $2::regclass)
			  AND force_delegation IS NOT DISTINCT FROM $3)`,
			qualifiedName(schema, f.signature), qualifiedName(schema, "idempotency_keys"), f.force).Scan(&exists, &ok); err != nil {
			return err
		}
		done[f.signature] = ok || f.optional && !exists
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	var stmts []string
	for i, sql := range CitusDistribution(schema) {
		switch {
		case i == 0: // the session's setting, below
		case i <= len(distributed) && distributed[i-1]:
		case i > len(distributed) && done[citusFunctions[i-1-len(distributed)].signature]:
		default:
			stmts = append(stmts, sql)
		}
	}
	if len(stmts) == 0 {
		return nil
	}
	// Each statement runs on its own, outside a transaction block when db
	// can (a pool or a connection): in one, Citus creates the shards over
	// a single connection per worker. All on one session, which the
	// setting is for, and which is reset after.
	if p, ok := db.(interface {
		Acquire(context.Context) (*pgxpool.Conn, error)
	}); ok {
		conn, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		return distribute(ctx, conn.Conn(), stmts)
	}
	if conn, ok := db.(*pgx.Conn); ok {
		return distribute(ctx, conn, stmts)
	}
	for _, sql := range stmts {
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL citus.enable_unsafe_triggers = on"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		}); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// distribute runs stmts on conn, each on its own, with Citus' unsafe
// triggers allowed for the session while they run.
func distribute(ctx context.Context, conn *pgx.Conn, stmts []string) (err error) {
	if _, err := conn.Exec(ctx, unsafeTriggers); err != nil {
		return err
	}
	defer func() {
		if _, rerr := conn.Exec(ctx, "RESET citus.enable_unsafe_triggers"); err == nil {
			err = rerr
		}
	}()
	for _, sql := range stmts {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}
