package keystore

import "context"

// What the library's SQL trusts of the database: that no role it does not
// trust can put objects where its statements look for them, and that the
// role running requests has the grants they need. Both are read from the
// catalog.

// openSchemasSQL names the schemas where PUBLIC (every role) may create
// objects, among those a statement of the library looks in: the session's
// search_path and the key table's schema ($1, or "" for the first schema
// on the path). A role that may create in one of them may define a
// function or an operator that matches a call in the library's SQL more
// closely than the built-in one it means (PostgreSQL's own argument
// types decide, whatever the schemas' order), and that then runs as
// whoever sends the statement: the migrating role, an operator, the
// runtime role. PostgreSQL 15 and later revoke CREATE on public from
// PUBLIC; earlier releases grant it. Every operator here is named with its
// schema, so this statement cannot be turned against its own sender.
const openSchemasSQL = `
SELECT coalesce(pg_catalog.array_agg(n.nspname::pg_catalog.text ORDER BY n.nspname), '{}')
FROM pg_catalog.pg_namespace n
WHERE (n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
       OR n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text::pg_catalog.name)
  AND EXISTS (SELECT FROM pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) a
              WHERE a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
                AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text)`

// OpenSchemas names the schemas, among the session's search_path and
// schema (the key table's, "" for the first on the path), where every
// role may create objects.
func OpenSchemas(ctx context.Context, db DB, schema string) ([]string, error) {
	var open []string
	err := db.QueryRow(ctx, openSchemasSQL, schema).Scan(&open)
	return open, err
}

// RuntimeGrants are the privileges the role that runs requests needs on
// each of the library's tables, as docs/security-and-limits.md gives them
// ("Database roles").
var RuntimeGrants = []struct{ Table, Privileges string }{
	{Table, "SELECT, INSERT, UPDATE, DELETE"},
	{"atomicphase_key_history", "SELECT, INSERT, UPDATE, DELETE"},
	{"atomicphase_audit", "SELECT, INSERT, DELETE"},
	{"atomicphase_workflow_versions", "SELECT, INSERT, UPDATE"},
	{"atomicphase_sweep_watermark", "SELECT, INSERT, UPDATE"},
	{"atomicphase_releases", "SELECT, INSERT, UPDATE"},
}

// missingGrantsSQL names, for each table ($1) the privileges ($2, each a
// comma-separated list) the session's role lacks on it.
const missingGrantsSQL = `
SELECT coalesce(pg_catalog.array_agg(g.tbl OPERATOR(pg_catalog.||) ': ' OPERATOR(pg_catalog.||) p.priv ORDER BY g.ord, p.ord), '{}')
FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) WITH ORDINALITY AS g(tbl, privs, ord),
     pg_catalog.unnest(pg_catalog.string_to_array(g.privs, ', ')) WITH ORDINALITY AS p(priv, ord)
WHERE pg_catalog.to_regclass(g.tbl) IS NOT NULL
  AND NOT pg_catalog.has_table_privilege(pg_catalog.to_regclass(g.tbl), p.priv)`

// MissingGrants names the privileges the session's role lacks on the
// library's tables in schema, each as "table: PRIVILEGE".
func MissingGrants(ctx context.Context, db DB, schema string) ([]string, error) {
	tables := make([]string, len(RuntimeGrants))
	privs := make([]string, len(RuntimeGrants))
	for i, g := range RuntimeGrants {
		tables[i], privs[i] = qualifiedName(schema, g.Table), g.Privileges
	}
	var missing []string
	err := db.QueryRow(ctx, missingGrantsSQL, tables, privs).Scan(&missing)
	return missing, err
}
