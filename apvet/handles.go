package apvet

import (
	"go/ast"
	"go/constant"
	"go/types"

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

// queryWrapper names t when it is a query wrapper, as sqlc generates one:
// a struct that sends its statements through a field of an interface type
// a pool, a connection and a transaction all satisfy (sqlc's DBTX), and
// that is built on one of them (New(pool), q.WithTx(tx)). It must have a
// WithTx method or no other field, so that an application's own struct
// holding a DBTX among other things is not taken for one.
func queryWrapper(t types.Type) string {
	n, ok := types.Unalias(t).(*types.Named)
	if p, isPtr := types.Unalias(t).(*types.Pointer); isPtr {
		n, ok = types.Unalias(p.Elem()).(*types.Named)
	}
	if !ok || n.Obj().Pkg() == nil {
		return ""
	}
	st, ok := n.Underlying().(*types.Struct)
	if !ok {
		return ""
	}
	dbtx := false
	for f := range st.Fields() {
		// A transaction's own interfaces are not a DBTX: a struct holding
		// one holds a transaction (the stored-tx finding's business).
		if sendsStatements(f.Type()) && !isNamed(f.Type(), apPath, "Tx") && dbHandle(f.Type()) == "" {
			dbtx = true
		}
	}
	if !dbtx {
		return ""
	}
	withTx, _, _ := types.LookupFieldOrMethod(types.NewPointer(n), true, n.Obj().Pkg(), "WithTx")
	if _, isFunc := withTx.(*types.Func); !isFunc && st.NumFields() != 1 {
		return ""
	}
	return "*" + n.Obj().Pkg().Name() + "." + n.Obj().Name()
}

// sendsStatements reports whether t is an interface with the methods that
// send a statement (Exec, and Query or QueryRow, or their database/sql
// Context forms).
func sendsStatements(t types.Type) bool {
	it, ok := types.Unalias(t).Underlying().(*types.Interface)
	if !ok {
		return false
	}
	has := func(name string) bool {
		for m := range it.Methods() {
			if m.Name() == name {
				return true
			}
		}
		return false
	}
	return (has("Exec") && (has("Query") || has("QueryRow"))) ||
		(has("ExecContext") && (has("QueryContext") || has("QueryRowContext")))
}

// handleLike reports whether a value of type t stands for a transaction,
// a connection or a call guard: what a variable must be to be derived from
// the phase's tx or call (an error or a row count returned by tx.Exec is
// not).
func handleLike(t types.Type) bool {
	return t != nil && (dbHandle(t) != "" || queryWrapper(t) != "" || isNamed(t, apPath, "Tx") ||
		isPointerTo(t, apPath, "ForeignCall"))
}

// mentions reports whether e mentions one of set outside the function
// literals in it: tx.Conn(), q.WithTx(tx), New(tx) are built on tx.
func mentions(info *types.Info, e ast.Node, set map[types.Object]bool) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.Ident:
			if set[info.Uses[x]] {
				found = true
			}
		}
		return !found
	})
	return found
}

// derived collects the variables of body that hold a handle built on one
// of roots (conn := tx.Conn(), sp, err := tx.Begin(ctx), q :=
// s.q.WithTx(tx); sp, not err): they are the phase's transaction too. It
// iterates until no new one appears.
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
				lid, ok := l.(*ast.Ident)
				if !ok || !mentions(info, r, out) {
					continue
				}
				obj := info.Defs[lid]
				if obj == nil {
					obj = info.Uses[lid]
				}
				if obj != nil && !out[obj] && handleLike(obj.Type()) {
					out[obj] = true
					changed = true
				}
			}
			return true
		})
	}
	return out
}

// checkHandles reports every database handle and query wrapper used in
// body that is not built on the phase's own transaction (ok), once per
// handle. The parameters of function literals inside body are left alone:
// whoever calls the literal hands them over (pgx.BeginFunc's tx, which that
// call's own finding covers). So are the wrappers held in variables of the
// body: the handle they were built on is reported where it is used.
func checkHandles(c *checker, body *ast.BlockStmt, ok map[types.Object]bool, phaseTx string, why string) {
	info := c.pass.TypesInfo
	seen := map[string]bool{}
	params := map[types.Object]bool{}
	exempt := map[ast.Expr]bool{}
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			if x.Type.Params != nil {
				for _, f := range x.Type.Params.List {
					for _, name := range f.Names {
						params[info.Defs[name]] = true
					}
				}
			}
		case *ast.CallExpr:
			// s.q.WithTx(tx): the wrapper is rebuilt on tx.
			if sel, isSel := x.Fun.(*ast.SelectorExpr); isSel && queryWrapper(info.TypeOf(sel.X)) != "" {
				for _, a := range x.Args {
					if mentions(info, a, ok) {
						exempt[sel.X] = true
					}
				}
			}
		}
		return true
	})
	inBody := func(obj types.Object) bool { return body.Pos() <= obj.Pos() && obj.Pos() < body.End() }
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
		tv, found := info.Types[e]
		if !found || !tv.IsValue() || exempt[e] {
			return !exempt[e]
		}
		h, wrapper := dbHandle(tv.Type), queryWrapper(tv.Type)
		if h == "" && wrapper == "" {
			return true
		}
		id := rootIdent(e)
		if id != nil && (ok[info.Uses[id]] || params[info.Uses[id]]) {
			return true
		}
		if wrapper != "" && id == e && info.Uses[id] != nil && inBody(info.Uses[id]) {
			return true
		}
		name := types.ExprString(e)
		if seen[name] {
			return false
		}
		seen[name] = true
		what := "a " + h
		if wrapper != "" {
			what = "a " + wrapper + " built on a database handle"
			if phaseTx != "" {
				what += ", not on " + phaseTx
			}
		}
		fix := ""
		if m, _, _ := types.LookupFieldOrMethod(tv.Type, true, nil, "WithTx"); m != nil && phaseTx != "" {
			fix = " (use " + name + ".WithTx(" + phaseTx + "))"
		}
		c.report(e.Pos(), ruleHandle, "%s (%s) is used in a phase %s%s", name, what, why, fix)
		return false // report s.pool once, not s too
	})
}

// checkSQLText reports constant SQL text that is transaction control,
// passed to a method that sends or queues it.
func checkSQLText(c *checker, call *ast.CallExpr) {
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
		tv := c.pass.TypesInfo.Types[arg]
		if tv.Value == nil || tv.Value.Kind() != constant.String {
			continue
		}
		if stmt, found := txcontrol.Find(constant.StringVal(tv.Value)); found {
			c.report(arg.Pos(), ruleTxControl, "%q in a phase is transaction control: it would end the phase's transaction, so the phase's writes would commit without its recovery point and a retry would repeat them; return an error from the phase to roll back, and leave the commit to the Runner", stmt)
		}
	}
}

// checkBeginOnConn reports transaction control begun on a connection:
// pgx.BeginFunc / BeginTxFunc on one, or its Begin / BeginTx methods.
func checkBeginOnConn(c *checker, call *ast.CallExpr) {
	info := c.pass.TypesInfo
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "github.com/jackc/pgx/v5" {
		return
	}
	sig := fn.Type().(*types.Signature)
	switch {
	case sig.Recv() == nil && (fn.Name() == "BeginFunc" || fn.Name() == "BeginTxFunc") && len(call.Args) > 1:
		if dbHandle(info.TypeOf(call.Args[1])) == "*pgx.Conn" {
			c.report(call.Pos(), ruleTxControl, "pgx.%s on a connection in a phase begins and commits a transaction of its own on the phase's connection: its COMMIT ends the phase's transaction (the Runner refuses it and fails the phase); pass the phase's tx instead, which opens a savepoint", fn.Name())
		}
	case sig.Recv() != nil && (fn.Name() == "Begin" || fn.Name() == "BeginTx") && dbHandle(sig.Recv().Type()) == "*pgx.Conn":
		c.report(call.Pos(), ruleTxControl, "%s on a connection in a phase begins a transaction of its own on the phase's connection: its Commit ends the phase's transaction (the Runner refuses it and fails the phase); call tx.Begin for a savepoint instead", fn.Name())
	}
}
