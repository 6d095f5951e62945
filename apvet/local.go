package apvet

import (
	"go/ast"
	"go/types"
)

// checkLocal checks a function taking the phase's transaction tx: a local
// phase or a foreign phase's record step.
func checkLocal(c *checker, body *ast.BlockStmt, tx *types.Var) {
	info := c.pass.TypesInfo
	own := derived(info, body, tx)
	checkHandles(c, body, own, tx.Name(), "instead of its transaction "+tx.Name()+": what it writes there commits on its own, outside the phase's transaction, and a retry of the phase writes it again; send it through "+tx.Name())
	checkGoroutines(c, body, own)
	checkStored(c, body, own)
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		checkSQLText(c, call)
		checkBeginOnConn(c, call)
		if r := c.funcs.requestOf(info, call); r != nil {
			c.report(call.Pos(), ruleLocalIO, "%s in a local phase: network I/O inside the phase's transaction holds it open for the call and is repeated by every retry of the phase, with nothing to deduplicate it; make the call in a foreign phase (atomicphase.Foreign) through call.Do or call.Transport", r.what)
		}
		return true
	})
}

// checkStored reports the phase's transaction stored where it outlives the
// phase: in a variable declared outside the function, a field, a map or a
// slice element.
func checkStored(c *checker, body *ast.BlockStmt, tx map[types.Object]bool) {
	info := c.pass.TypesInfo
	ast.Inspect(body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return true
		}
		for i, r := range as.Rhs {
			id, ok := ast.Unparen(r).(*ast.Ident)
			if !ok || !tx[info.Uses[id]] {
				continue
			}
			outside := true
			if l, ok := as.Lhs[i].(*ast.Ident); ok {
				obj := info.Defs[l]
				if obj == nil {
					obj = info.Uses[l]
				}
				outside = obj != nil && !(body.Pos() <= obj.Pos() && obj.Pos() < body.End())
			}
			if outside {
				c.report(as.Pos(), ruleTxStored, "the phase's transaction (%s) is stored where it outlives the phase: used after the phase, it runs outside any transaction the Runner commits, or fails; use it only inside the phase's function", id.Name)
			}
		}
		return true
	})
}
