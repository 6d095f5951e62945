package atomicphase_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// updateSchema rewrites schema.sql from what the migrations make (make
// schema): go test -run TestSchemaFile . -args -update-schema.
var updateSchema = flag.Bool("update-schema", false, "rewrite schema.sql from a database the migrations made")

// schemaHeader opens schema.sql.
const schemaHeader = `-- The current atomicphase schema, as the numbered migrations in migration/
-- leave it, for projects that apply schema with their own migration tool.
-- Migrate applies the migrations one by one and records each; this file
-- makes the same tables, indexes, functions and comments at once (a test
-- compares the two databases object by object), and records the
-- migrations as applied, so that a later Migrate applies only newer ones.
-- It is written from the catalog of a migrated database by make schema.
--
-- It is in four parts: the tables, each followed by what its columns hold
-- and its indexes; the functions; the trigger; the migrations recorded.
-- On Citus, distribute the tables and functions after applying it
-- (atomicphase.CitusDistribution, or migrate --citus).
`

// tableOrder is the order schema.sql gives the tables: the key table, what
// is written beside it, then the library's own bookkeeping.
var tableOrder = []string{"idempotency_keys", "atomicphase_key_history", "atomicphase_audit",
	"atomicphase_workflow_versions", "atomicphase_sweep_watermark", "atomicphase_migration"}

// schemaPrefix is what the catalog writes before a name of the schema the
// file is for: the search_path's (public here), left out of the file.
var schemaPrefix = regexp.MustCompile(`\bpublic\.`)

// writeSchemaFile writes the schema of the database q migrated, in the
// public schema, as schema.sql says it is.
func writeSchemaFile(ctx context.Context, q *pgx.Conn) (string, error) {
	var b strings.Builder
	b.WriteString(schemaHeader)
	tables, err := schemaTables(ctx, q)
	if err != nil {
		return "", err
	}
	b.WriteString("\n-- Tables\n")
	for _, t := range tables {
		if err := writeTable(ctx, q, &b, t); err != nil {
			return "", fmt.Errorf("table %s: %w", t, err)
		}
	}
	b.WriteString("\n-- Functions, by name. A function's body is checked when it runs, not\n-- here, as pg_dump has it: some call functions written after them.\n\nSET check_function_bodies = off;\n")
	if err := writeFunctions(ctx, q, &b); err != nil {
		return "", err
	}
	b.WriteString("\n-- The key table's DELETE guard\n")
	rows, err := q.Query(ctx, `SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND NOT t.tgisinternal ORDER BY t.tgname`)
	if err != nil {
		return "", err
	}
	triggers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	for _, def := range triggers {
		fmt.Fprintf(&b, "\n%s;\n", schemaPrefix.ReplaceAllString(def, ""))
	}
	b.WriteString("\n-- The migrations this file stands for, recorded as applied\n\n")
	rows, err = q.Query(ctx, `SELECT format('(%s, %L)', version, name) FROM atomicphase_migration ORDER BY version`)
	if err != nil {
		return "", err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "INSERT INTO atomicphase_migration (version, name) VALUES\n    %s;\n", strings.Join(applied, ",\n    "))
	return b.String(), nil
}

// schemaTables are the schema's tables in tableOrder, any other after them
// by name.
func schemaTables(ctx context.Context, q *pgx.Conn) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(names, func(a, b string) int {
		rank := func(s string) int {
			if i := slices.Index(tableOrder, s); i >= 0 {
				return i
			}
			return len(tableOrder)
		}
		return rank(a) - rank(b)
	})
	return names, nil
}

func writeTable(ctx context.Context, q *pgx.Conn, b *strings.Builder, table string) error {
	var comment *string
	var options []string
	if err := q.QueryRow(ctx, `SELECT obj_description(c.oid, 'pg_class'), coalesce(c.reloptions, '{}')
		FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&comment, &options); err != nil {
		return err
	}
	rows, err := q.Query(ctx, `SELECT quote_ident(a.attname), format_type(a.atttypid, a.atttypmod), a.attnotnull,
			coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text, col_description(a.attrelid, a.attnum)
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, table)
	if err != nil {
		return err
	}
	type column struct {
		name, typ  string
		notNull    bool
		def, ident string
		comment    *string
	}
	var cols []column
	var c column
	_, err = pgx.ForEachRow(rows, []any{&c.name, &c.typ, &c.notNull, &c.def, &c.ident, &c.comment}, func() error {
		cols = append(cols, c)
		return nil
	})
	if err != nil {
		return err
	}
	rows, err = q.Query(ctx, `SELECT format('CONSTRAINT %I %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
		WHERE conrelid = $1::regclass AND contype <> 'n' ORDER BY contype <> 'p', conname`, table)
	if err != nil {
		return err
	}
	constraints, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}

	b.WriteString("\n")
	if comment != nil {
		writeComment(b, "", *comment)
	}
	var lines []string
	for _, c := range cols {
		var (
			line  strings.Builder
			below string
		)
		if c.comment != nil {
			var cb strings.Builder
			writeComment(&cb, "    ", *c.comment)
			below = cb.String()
		}
		fmt.Fprintf(&line, "%s    %s %s", below, c.name, c.typ)
		switch c.ident {
		case "a":
			line.WriteString(" GENERATED ALWAYS AS IDENTITY")
		case "d":
			line.WriteString(" GENERATED BY DEFAULT AS IDENTITY")
		}
		if c.notNull {
			line.WriteString(" NOT NULL")
		}
		if c.def != "" {
			line.WriteString(" DEFAULT " + c.def)
		}
		lines = append(lines, line.String())
	}
	for _, con := range constraints {
		lines = append(lines, "    "+schemaPrefix.ReplaceAllString(con, ""))
	}
	fmt.Fprintf(b, "CREATE TABLE %s (\n%s\n)", table, strings.Join(lines, ",\n"))
	if len(options) > 0 {
		fmt.Fprintf(b, " WITH (%s)", strings.Join(options, ", "))
	}
	b.WriteString(";\n")
	b.WriteString("-- The same words, in the catalog (psql's \\d+ shows them):\n")
	if comment != nil {
		fmt.Fprintf(b, "COMMENT ON TABLE %s IS %s;\n", table, sqlLiteral(*comment))
	}
	for _, c := range cols {
		if c.comment != nil {
			fmt.Fprintf(b, "COMMENT ON COLUMN %s.%s IS %s;\n", table, c.name, sqlLiteral(*c.comment))
		}
	}
	rows, err = q.Query(ctx, `SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = $1::regclass AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)
		ORDER BY i.indexrelid::regclass::text`, table)
	if err != nil {
		return err
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, def := range indexes {
		fmt.Fprintf(b, "%s;\n", schemaPrefix.ReplaceAllString(def, ""))
	}
	return nil
}

func writeFunctions(ctx context.Context, q *pgx.Conn, b *strings.Builder) error {
	rows, err := q.Query(ctx, `SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
			obj_description(p.oid, 'pg_proc'), p.proacl IS NOT NULL,
			coalesce((SELECT array_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END
				ORDER BY a.grantee) FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner), '{}')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public' ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)`)
	if err != nil {
		return err
	}
	var (
		name, args, def string
		comment         *string
		explicitACL     bool
		grantees        []string
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &args, &def, &comment, &explicitACL, &grantees}, func() error {
		b.WriteString("\n")
		if comment != nil {
			writeComment(b, "", *comment)
		}
		// Only the function's name is qualified in what the catalog
		// writes: its body is the migration's text.
		head, body, _ := strings.Cut(def, "\n")
		fmt.Fprintf(b, "%s\n%s;\n", schemaPrefix.ReplaceAllString(head, ""), strings.TrimRight(body, "\n"))
		sig := fmt.Sprintf("%s(%s)", name, args)
		if comment != nil {
			fmt.Fprintf(b, "COMMENT ON FUNCTION %s IS %s;\n", sig, sqlLiteral(*comment))
		}
		if explicitACL && !slices.Contains(grantees, "PUBLIC") {
			fmt.Fprintf(b, "REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;\n", sig)
		}
		for _, g := range grantees {
			if g != "PUBLIC" {
				fmt.Fprintf(b, "GRANT EXECUTE ON FUNCTION %s TO %s;\n", sig, g)
			}
		}
		return nil
	})
	return err
}

// writeComment writes text as -- lines of at most 78 columns, indented.
func writeComment(b *strings.Builder, indent, text string) {
	line := indent + "--"
	for _, w := range strings.Fields(text) {
		if len(line)+1+len(w) > 78 && line != indent+"--" {
			b.WriteString(line + "\n")
			line = indent + "--"
		}
		line += " " + w
	}
	b.WriteString(line + "\n")
}

func sqlLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// catalogOf is what a database's public schema holds, object by object, as
// text two databases can be compared by: each table's columns (in order,
// with type, nullability, default, identity and comment), constraints,
// options, comment, indexes and non-owner privileges; each function's
// definition, comment and privileges; each trigger; the migrations
// recorded.
func catalogOf(t *testing.T, db *atomicphasetest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `
		SELECT 'table ' || c.relname || ' ' || coalesce(obj_description(c.oid, 'pg_class'), '-') || ' ' || coalesce(c.reloptions::text, '-')
			|| ' acl ' || coalesce((SELECT string_agg(a.grantee::regrole::text || ':' || a.privilege_type, ',' ORDER BY 1)
				FROM aclexplode(c.relacl) a WHERE a.grantee <> c.relowner), '-')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		UNION ALL
		SELECT format('column %s #%s %s %s notnull=%s default=%s identity=%s %s', c.relname,
				rank() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname, format_type(a.atttypid, a.atttypmod),
				a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), '-'), a.attidentity, coalesce(col_description(c.oid, a.attnum), '-'))
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND contype <> 'n'
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid) || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
			|| ' acl ' || coalesce((SELECT string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
				|| ':' || a.privilege_type, ',' ORDER BY 1) FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner), 'default')
		FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
		UNION ALL
		SELECT format('migration %s %s', version, name) FROM atomicphase_migration
		ORDER BY 1`)
	require.NoError(t, err)
	objects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return objects
}

// schema.sql makes what the migrations make, object by object, and is
// what make schema writes from a migrated database.
func TestSchemaFileIsWhatTheMigrationsMake(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "schema.sql is applied to a plain PostgreSQL")
	migrated := atomicphasetest.NewDB(t, nil)
	conn, err := migrated.Pool.Acquire(t.Context())
	require.NoError(t, err)
	written, err := writeSchemaFile(t.Context(), conn.Conn())
	conn.Release()
	require.NoError(t, err)
	if *updateSchema {
		require.NoError(t, os.WriteFile("schema.sql", []byte(written), 0o644))
	}
	file, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	require.Equal(t, written, string(file), "schema.sql is not what the migrations make: regenerate it with `make schema`")

	fromFile := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	applySchemaFile(t, fromFile)
	require.Equal(t, catalogOf(t, migrated), catalogOf(t, fromFile))
}
