package keystore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// schemaObjects are the tables and functions this version of the library
// uses, as to_regclass and to_regprocedure name them. Missing looks for
// each; keep the list in step with the newest migration.
var schemaObjects = []struct{ kind, name string }{
	{"table", "idempotency_keys"},
	{"table", "atomicphase_audit"},
	{"column", "idempotency_keys.unknown_at"},
	{"column", "idempotency_keys.resolved_result"},
	{"column", "idempotency_keys.final_parked_at"},
	{"column", "idempotency_keys.lease_us"},
	{"column", "idempotency_keys.call_until"},
	{"function", "atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint, integer)"},
	{"function", "atomicphase_checkpoint(text, text, bigint, text, text, bytea, integer, jsonb, bytea)"},
	{"function", "atomicphase_stale_before(bigint)"},
	{"function", "atomicphase_lock_takeable(timestamptz, timestamptz)"},
	{"function", "atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer)"}, // a previous release's, distributed too
	{"function", "atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint)"},
	{"function", "atomicphase_held_until(timestamptz, bigint, timestamptz, bigint)"},
	{"function", "atomicphase_lock_expires(timestamptz, bigint, timestamptz, bigint, timestamptz)"},
	{"function", "atomicphase_renew(text, text, bigint, bigint, bigint)"},
	{"function", "atomicphase_take(text, text, bigint, bigint, boolean)"},
	{"function", "atomicphase_release(text, text, bigint, text, bigint, boolean, boolean)"},
	{"function", "atomicphase_release(text, text, bigint, text, bigint, boolean, boolean, boolean)"},
	{"function", "atomicphase_release(text, text, bigint, text, bigint, boolean, boolean, boolean, boolean)"},
	{"column", "idempotency_keys.called_at"},
	{"function", "atomicphase_unpark(text, text)"},
	{"function", "atomicphase_record_resolution(text, text, boolean, text, bigint)"},
	{"function", "atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer)"},
	{"function", "atomicphase_record_verdict(text, text, boolean, text, bigint, jsonb)"},
	{"table", "atomicphase_workflow_versions"},
	{"column", "idempotency_keys.workflow_version"},
	{"function", "atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer, text)"},
	{"function", "atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint, text)"},
	{"function", "atomicphase_claim(text, text)"},
	{"function", "atomicphase_record_unit(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)"},
	{"table", "atomicphase_sweep_watermark"},
	{"function", "atomicphase_schedule(text, text, boolean)"},
	{"column", "idempotency_keys.status"},
	{"table", "atomicphase_key_history"},
	{"function", "atomicphase_refuse(text, text)"},
	{"function", `atomicphase_key_event(text, text, text, "char", "char", text, integer, bigint, text)`},
	{"function", "atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea)"},
	{"index", "idempotency_keys_waiting_idx"},
	{"index", "idempotency_keys_parked_idx"},
	{"table", "atomicphase_releases"},
	{"column", "atomicphase_workflow_versions.current_seen_at"},
}

// ScopeCapIndex is the index the per-scope cap on unfinished keys counts
// with (Config.MaxUnfinishedPerScope): not part of the schema every
// request pays for, since its predicate reads the response status and a
// finish would then write an entry in it (no HOT update). Built by
// ScopeCapIndexSQL, when the cap is used.
const ScopeCapIndex = "idempotency_keys_unfinished_idx"

// scopeCapIndexSQL builds ScopeCapIndex, concurrently (outside a
// transaction).
const scopeCapIndexSQL = `CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unfinished_idx
    ON /* TEMPLATE: schema */idempotency_keys (scope) WHERE response_status IS NULL`

// ScopeCapIndexSQL is the statement that builds ScopeCapIndex in schema.
func ScopeCapIndexSQL(schema string) string { return Render(scopeCapIndexSQL, schema) }

// tableExistsSQL tells whether the key table exists.
const tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// TableExists reports whether the key table exists in schema.
func TableExists(ctx context.Context, db DB, schema string) (bool, error) {
	var exists bool
	err := db.QueryRow(ctx, tableExistsSQL, qualifiedName(schema, Table)).Scan(&exists)
	return exists, err
}

// MissingScopeCapIndex reports whether the Store's schema lacks a valid
// ScopeCapIndex.
func (s *Store) MissingScopeCapIndex(ctx context.Context, db DB) (bool, error) {
	var missing []string
	err := db.QueryRow(ctx, checkSchemaSQL, []string{"index"}, []string{Qualifier(s.schema) + ScopeCapIndex}).Scan(&missing)
	return len(missing) > 0, err
}

const checkSchemaSQL = `
SELECT coalesce(array_agg(o.name ORDER BY o.ord), '{}')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS o(kind, name, ord)
WHERE CASE o.kind
        WHEN 'table' THEN to_regclass(o.name) IS NULL
        WHEN 'index' THEN NOT EXISTS (SELECT FROM pg_index WHERE indexrelid = to_regclass(o.name) AND indisvalid)
        WHEN 'column' THEN NOT EXISTS (
            SELECT FROM pg_attribute
            WHERE attrelid = to_regclass(substring(o.name FROM '^(.*)\.[^.]*$'))
              AND attname = substring(o.name FROM '[^.]*$') AND NOT attisdropped)
        ELSE to_regprocedure(o.name) IS NULL END`

// Missing names the tables, columns and functions this version needs that
// the Store's schema lacks, reading the catalog only.
func (s *Store) Missing(ctx context.Context, db DB) ([]string, error) {
	kinds := make([]string, len(schemaObjects))
	names := make([]string, len(schemaObjects))
	q := Qualifier(s.schema)
	for i, o := range schemaObjects {
		kinds[i], names[i] = o.kind, q+o.name
	}
	var missing []string
	err := db.QueryRow(ctx, checkSchemaSQL, kinds, names).Scan(&missing)
	return missing, err
}

// serverPIDSQL asks which server process runs the session. It is sent
// with the simple protocol, which every exec mode and every pooler takes.
const serverPIDSQL = `SELECT pg_backend_pid()`

// ServerPID is the process id of the server backend that runs the
// statement: behind a pooler (PgBouncer), not the one the connection's
// start-up message announced, which the pooler made up.
func ServerPID(ctx context.Context, db DB) (uint32, error) {
	var pid uint32
	err := db.QueryRow(ctx, serverPIDSQL, pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}
