package apvet

import (
	"go/ast"
	"go/constant"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"

	"github.com/atomicphase/atomicphase/internal/txcontrol"
)

// dbHandle names the database handle type of t, or "" when it is none: the
// handles whose statements run outside the phase's transaction.
func dbHandle(t types.Type) string {
	for _, h := range []struct{ path, name string }{
		{"github.com/jackc/pgx/v5/pgxpool", "Pool"},
		{"github.com/jackc/pgx/v5/pgxpool", "Conn"},
		{"github.com/jackc/pgx/v5", "Conn"},
		{"github.com/jackc/pgx/v5/pgconn", "PgConn"},
		{"database/sql", "DB"},
		{"database/sql", "Conn"},
		{"database/sql", "Tx"},
	} {
		if isPointerTo(t, h.path, h.name) {
			return "*" + lastElem(h.path) + "." + h.name
		}
	}
	if isNamed(t, "github.com/jackc/pgx/v5", "Tx") {
		return "pgx.Tx"
	}
	return ""
}

func lastElem(path string) string {
	switch path {
	case "github.com/jackc/pgx/v5":
		return "pgx"
	case "database/sql":
		return "sql"
	}
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			return path[i+1:]
		}
	}
	return path
}

// derived collects the variables of body assigned from an expression built
// on one of roots (conn := tx.Conn(), sp, err := tx.Begin(ctx)): they are
// the phase's transaction too. It iterates until no new one appears.
func derived(info *types.Info, body *ast.BlockStmt, roots ...types.Object) map[types.Object]bool {
	out := map[types.Object]bool{}
	for _, r := range roots {
		out[r] = true
	}
	for changed := true; changed; {
		changed = false
		ast.Inspect(body, func(n ast.Node) bool {
			var lhs, rhs []ast.Expr
			switch s := n.(type) {
			case *ast.AssignStmt:
				lhs, rhs = s.Lhs, s.Rhs
			case *ast.ValueSpec:
				for _, name := range s.Names {
					lhs = append(lhs, name)
				}
				rhs = s.Values
			default:
				return true
			}
			if len(rhs) == 0 {
				return true
			}
			for i, l := range lhs {
				r := rhs[0]
				if len(rhs) == len(lhs) {
					r = rhs[i]
				}
				id := rootIdent(r)
				if id == nil || !out[info.Uses[id]] {
					continue
				}
				if lid, ok := l.(*ast.Ident); ok {
					obj := info.Defs[lid]
					if obj == nil {
						obj = info.Uses[lid]
					}
					if obj != nil && !out[obj] {
						out[obj] = true
						changed = true
					}
				}
			}
			return true
		})
	}
	return out
}

// checkHandles reports every database handle used in body that is not
// built on the phase's own transaction (ok), once per handle. The
// parameters of function literals inside body are left alone: whoever
// calls the literal hands them over (pgx.BeginFunc's tx, which that call's
// own diagnostic covers).
func checkHandles(pass *analysis.Pass, body *ast.BlockStmt, ok map[types.Object]bool, why string) {
	seen := map[string]bool{}
	params := map[types.Object]bool{}
	ast.Inspect(body, func(n ast.Node) bool {
		if lit, isLit := n.(*ast.FuncLit); isLit && lit.Type.Params != nil {
			for _, f := range lit.Type.Params.List {
				for _, name := range f.Names {
					params[pass.TypesInfo.Defs[name]] = true
				}
			}
		}
		return true
	})
	ast.Inspect(body, func(n ast.Node) bool {
		var e ast.Expr
		switch x := n.(type) {
		case *ast.SelectorExpr:
			e = x
		case *ast.Ident:
			e = x
		default:
			return true
		}
		tv, found := pass.TypesInfo.Types[e]
		if !found || !tv.IsValue() {
			return true
		}
		h := dbHandle(tv.Type)
		if h == "" {
			return true
		}
		if id := rootIdent(e); id != nil && (ok[pass.TypesInfo.Uses[id]] || params[pass.TypesInfo.Uses[id]]) {
			return true
		}
		name := types.ExprString(e)
		if !seen[name] {
			seen[name] = true
			pass.Reportf(e.Pos(), "%s (a %s) is used in a phase %s", name, h, why)
		}
		return false // report s.pool once, not s too
	})
}

// checkSQLText reports constant SQL text that is transaction control,
// passed to a method that sends or queues it.
func checkSQLText(pass *analysis.Pass, call *ast.CallExpr) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return
	}
	switch sel.Sel.Name {
	case "Exec", "Query", "QueryRow", "Queue", "Prepare", "ExecContext", "QueryContext", "QueryRowContext":
	default:
		return
	}
	for _, arg := range call.Args {
		tv := pass.TypesInfo.Types[arg]
		if tv.Value == nil || tv.Value.Kind() != constant.String {
			continue
		}
		if stmt, found := txcontrol.Find(constant.StringVal(tv.Value)); found {
			pass.Reportf(arg.Pos(), "%q in a phase is transaction control: it would end the phase's transaction, so the phase's writes would commit without its recovery point and a retry would repeat them; return an error from the phase to roll back, and leave the commit to the Runner", stmt)
		}
	}
}

// checkBeginOnConn reports transaction control begun on a connection:
// pgx.BeginFunc / BeginTxFunc on one, or its Begin / BeginTx methods.
func checkBeginOnConn(pass *analysis.Pass, call *ast.CallExpr) {
	fn, _ := typeutil.Callee(pass.TypesInfo, call).(*types.Func)
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "github.com/jackc/pgx/v5" {
		return
	}
	sig := fn.Type().(*types.Signature)
	switch {
	case sig.Recv() == nil && (fn.Name() == "BeginFunc" || fn.Name() == "BeginTxFunc") && len(call.Args) > 1:
		if dbHandle(pass.TypesInfo.TypeOf(call.Args[1])) == "*pgx.Conn" {
			pass.Reportf(call.Pos(), "pgx.%s on a connection in a phase begins and commits a transaction of its own on the phase's connection: its COMMIT ends the phase's transaction (the Runner refuses it and fails the phase); pass the phase's tx instead, which opens a savepoint", fn.Name())
		}
	case sig.Recv() != nil && (fn.Name() == "Begin" || fn.Name() == "BeginTx") && dbHandle(sig.Recv().Type()) == "*pgx.Conn":
		pass.Reportf(call.Pos(), "%s on a connection in a phase begins a transaction of its own on the phase's connection: its Commit ends the phase's transaction (the Runner refuses it and fails the phase); call tx.Begin for a savepoint instead", fn.Name())
	}
}
