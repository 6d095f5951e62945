package keystore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The key table's SQL is Citus-compatible by construction (docs/scale.md):
// these tests read every statement the package sends and the newest body of
// every function the migrations create, and check the rules that make it
// so. The Citus test mode (ATOMICPHASE_TEST_CITUS_URL) then runs them.

// timeCall matches a call of a stable or volatile function that reads the
// clock or draws at random, and the stale-lock cut-off built on now().
var timeCall = regexp.MustCompile(`(?i)\b(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday|random|gen_random_uuid|atomicphase_stale_before)\s*\(|\b(current_timestamp|localtimestamp|current_time|current_date)\b`)

// modifiesKeys matches a statement that writes the key table directly.
var modifiesKeys = regexp.MustCompile(`(?is)(\bUPDATE\s+(/\* TEMPLATE: schema \*/)?(\S+\.)?idempotency_keys\b|\bINSERT\s+INTO\s+(/\* TEMPLATE: schema \*/)?(\S+\.)?idempotency_keys\b|\bDELETE\s+FROM\s+(/\* TEMPLATE: schema \*/)?(\S+\.)?idempotency_keys\b)`)

// functionCall matches a call of one of the package's functions, with its
// first argument.
var functionCall = regexp.MustCompile(`atomicphase_(\w+)\(\s*([^,)]*)`)

// fanOut are the statements that read every
// shard of a distributed key table, on purpose: none is on a request's
// path. Every other statement is keyed by scope.
var fanOut = map[string]string{
	"listKeysSQL":       "Runner.ListKeys, for operators: filters the whole table",
	"abandonedSQL":      "the sweep looks for abandoned keys in every scope",
	"unknownSQL":        "the sweep counts abandoned keys of unknown workflows in every scope",
	"reapPickSQL":       "the sweep picks old finished keys of every scope, to delete each on its own",
	"passedSQL":         "the sweep's watermark passes the new keys of every scope, to mark each on its own",
	"scopeCapIndexSQL":  "MigrateOpts.ScopeCap builds an index over every shard",
	"ScopeCapIndex":     "the name of that index, not a statement",
	"unfinishedKeys":    "a part of the console's statements, each of which reads every scope",
	"reapParkedPickSQL": "the sweep picks parked keys past their retention in every scope, to delete each on its own",
	"versionDrainedSQL": "a version's name is given to another phase list only when no key of it is unfinished in any scope",
	"ageLocksSQL":       "tests age every held lock (atomicphasetest.AgeLocks)",
	"ageBackoffsSQL":    "the explorer's sweep makes every key due (Scenario.Sweep)",
	"levelsSQL":         "the console counts the unfinished keys of every scope",
	"recentTroubleSQL":  "the console lists recent parks and unknown outcomes of every scope",
	"pageSQL":           "the console pages through the whole table",
	"pageUnfinishedSQL": "the console pages through the unfinished keys of every scope",
	"otherVersionsSQL":  "the sweep counts the keys of other workflow versions in every scope",
	"versionKeysSQL":    "the sweep lists the keys of a workflow version no process runs, in every scope, to park them",
	"versionsSQL":       "Runner.Versions, for operators: counts the unfinished keys of every version",
}

// timeInSubquery are modifications whose only time is read by a subquery
// that runs as a SELECT of its own (on Citus, on the workers): the reap's
// cut-off.
var timeInSubquery = map[string]bool{}

// packageStatements returns the package's string constants that mention
// the key table or its functions, by name, evaluated from the source.
func packageStatements(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	exprs := map[string]ast.Expr{}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						exprs[id.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	var eval func(ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.Ident:
			if x, ok := exprs[e.Name]; ok {
				return eval(x)
			}
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				a, ok1 := eval(e.X)
				b, ok2 := eval(e.Y)
				return a + b, ok1 && ok2
			}
		}
		return "", false
	}
	out := map[string]string{}
	for name, e := range exprs {
		if s, ok := eval(e); ok && (strings.Contains(s, "idempotency_keys") || functionCall.MatchString(s)) &&
			!strings.HasSuffix(name, "Columns") && name != "statusSQL" && name != "Table" {
			out[name] = Render(s, "")
		}
	}
	return out
}

func TestStatementsAreCitusCompatible(t *testing.T) {
	t.Parallel()
	stmts := packageStatements(t)
	for _, name := range []string{"acquireSQL", "peekSQL", "recordSQL", "ownedBySQL", "takeSQL", "renewSQL", "releaseSQL",
		"checkpointSQL", "clearLastErrorSQL", "inspectSQL", "listKeysSQL", "unparkSQL", "forgetSQL", "recordResolutionSQL",
		"takeVerdictSQL", "abandonedSQL", "unknownSQL", "reapPickSQL", "reapOneSQL", "reapParkedPickSQL", "reapParkedOneSQL"} {
		require.Contains(t, stmts, name, "the statements are found in the source")
	}
	distributed := map[string]bool{}
	for _, f := range citusFunctions {
		distributed[f.signature[:strings.IndexByte(f.signature, '(')]] = true
	}
	for name, sql := range stmts {
		if strings.HasPrefix(name, "plain") || name == "keyEventSQL" {
			// Sent on one PostgreSQL only (Store.SetPlain): on Citus the
			// functions they are named after stand in for them.
			continue
		}
		if modifiesKeys.MatchString(sql) && !timeInSubquery[name] {
			require.NotRegexp(t, timeCall, sql,
				"%s writes the key table directly, so it must take no time (nor draw at random): on Citus "+
					"the coordinator would evaluate it, with its own clock; write through a function instead", name)
		}
		for _, call := range functionCall.FindAllStringSubmatch(sql, -1) {
			fn := "atomicphase_" + call[1]
			if fn == "atomicphase_lock_takeable" || fn == "atomicphase_stale_before" || fn == "atomicphase_held_until" || fn == "atomicphase_lock_expires" {
				continue // inlined SQL helpers, evaluated where the statement runs
			}
			require.True(t, distributed[fn], "%s calls %s, which CitusDistribution must distribute", name, fn)
			require.True(t, strings.HasPrefix(call[2], "$1"),
				"%s passes the scope first to %s, the argument it is distributed by", name, fn)
		}
		if why, ok := fanOut[name]; ok {
			require.NotEmpty(t, why)
			continue
		}
		if strings.Contains(sql, "idempotency_keys") {
			require.Regexp(t, `\bscope = \$1\b`, sql, "%s is keyed by scope, or listed in fanOut with a reason", name)
		}
	}
}

// TestFunctionsAreCitusCompatible checks the newest definition of every
// PL/pgSQL function in the migrations: no statement in it that writes the
// key table evaluates a clock or random function (the time is read once into
// a variable, on the node the function runs on), and every statement in a
// function distributed by p_scope touches that scope only.
func TestFunctionsAreCitusCompatible(t *testing.T) {
	t.Parallel()
	bodies := map[string]string{}
	create := regexp.MustCompile(`(?is)CREATE (?:OR REPLACE )?FUNCTION (?:/\* TEMPLATE: schema \*/)?(\w+)\((.*?)\$\$(.*?)\$\$`)
	ups, err := filepath.Glob(filepath.Join("..", "..", "migration", "*.up.sql"))
	require.NoError(t, err)
	require.NotEmpty(t, ups)
	slices.Sort(ups) // in version order: the newest definition wins
	for _, up := range ups {
		sql, err := os.ReadFile(up)
		require.NoError(t, err)
		for _, def := range create.FindAllStringSubmatch(string(sql), -1) {
			bodies[def[1]] = def[2] + "$$" + def[3]
		}
	}
	var names []string
	for name := range bodies {
		names = append(names, name)
	}
	slices.Sort(names)
	var scoped []string
	for _, name := range names {
		def := bodies[name]
		sig, body, _ := strings.Cut(def, "$$")
		for _, stmt := range strings.Split(body, ";") {
			if !modifiesKeys.MatchString(stmt) {
				continue
			}
			require.NotRegexp(t, timeCall, stmt, "%s: a statement that writes the key table reads the time once into a variable", name)
			// Citus refuses an upsert on a distributed table whose
			// ON CONFLICT ... WHERE calls anything not IMMUTABLE: no
			// function of ours there, and no timestamptz + interval (stable).
			if _, upsert, ok := strings.Cut(stmt, "DO UPDATE"); ok {
				if _, where, ok := strings.Cut(upsert, "WHERE"); ok {
					where, _, _ = strings.Cut(where, "RETURNING")
					require.NotContains(t, where, "atomicphase_", "%s: a function call in ON CONFLICT ... WHERE", name)
					require.NotRegexp(t, `\+\s*(coalesce|\S+\s*\*\s*interval)`, where, "%s: timestamptz + interval in ON CONFLICT ... WHERE", name)
				}
			}
			// Nor an UPDATE or DELETE whose CASE or COALESCE calls anything
			// not IMMUTABLE: the held-until helpers are stable, so the rule
			// is written out in immutable operators where a statement writes.
			if !strings.Contains(stmt, "INSERT INTO") {
				require.NotRegexp(t, `atomicphase_(held_until|lock_expires)`, stmt,
					"%s: a stable function in a statement that writes the key table", name)
			}
			if strings.Contains(sig, "p_scope text") {
				require.Regexp(t, `(?s)(\w\.)?scope = p_scope|VALUES \(p_scope`, stmt, "%s: a statement keyed by p_scope", name)
			}
		}
		if strings.Contains(sig, "p_scope text") {
			scoped = append(scoped, name)
		}
	}
	var distributed []string
	for _, f := range citusFunctions {
		distributed = append(distributed, f.signature[:strings.IndexByte(f.signature, '(')])
	}
	slices.Sort(distributed)
	distributed = slices.Compact(distributed) // overloads
	require.Equal(t, scoped, distributed, "every function with a scope argument is distributed by it, and only those")
	for _, f := range citusFunctions {
		inTx := strings.HasPrefix(f.signature, "atomicphase_record(") || strings.HasPrefix(f.signature, "atomicphase_checkpoint(") ||
			strings.HasPrefix(f.signature, "atomicphase_claim(") || strings.HasPrefix(f.signature, "atomicphase_record_unit(") ||
			strings.HasPrefix(f.signature, "atomicphase_record_first(")
		require.Equal(t, inTx, f.force, "%s: force_delegation exactly for the functions called inside a phase's transaction", f.signature)
	}
	var objects []string
	for _, o := range schemaObjects {
		if o.kind == "function" {
			objects = append(objects, o.name)
		}
	}
	for _, f := range citusFunctions {
		if !f.optional {
			require.Contains(t, objects, f.signature, "CheckSchema looks for every distributed function")
		}
	}
}
