package apvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// checkLocal checks a function taking the phase's transaction tx: a local
// phase or a foreign phase's record step.
func checkLocal(pass *analysis.Pass, net helpers, body *ast.BlockStmt, tx *types.Var) {
	own := derived(pass.TypesInfo, body, tx)
	checkHandles(pass, body, own, "instead of its transaction "+tx.Name()+": what it writes there commits on its own, outside the phase's transaction, and a retry of the phase writes it again; send it through "+tx.Name())
	checkGoroutines(pass, body, own)
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		checkSQLText(pass, call)
		checkBeginOnConn(pass, call)
		if what := net.networkCall(pass.TypesInfo, call); what != "" {
			pass.Reportf(call.Pos(), "%s in a local phase: network I/O inside the phase's transaction holds it open for the call and is repeated by every retry of the phase, with nothing to deduplicate it; make the call in a foreign phase (atomicphase.Foreign) through call.Do or call.Transport", what)
		}
		return true
	})
}
