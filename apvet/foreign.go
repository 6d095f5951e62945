package apvet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/ast/astutil"
)

// checkForeign checks a function taking a *atomicphase.ForeignCall call: a
// foreign phase's call, or its reconcile function, whose lookup is made
// outside call.Do by design.
func checkForeign(pass *analysis.Pass, net helpers, body *ast.BlockStmt, call *types.Var, reconcile bool) {
	info := pass.TypesInfo
	checkHandles(pass, body, nil, "that makes a foreign call: a foreign phase holds no transaction, so what it writes there commits on its own and a retry writes it again; record the call's result in the phase's record step, through its tx")
	own := derived(info, body, call)

	// The guarded calls: call.Do's function literals, and whether the
	// phase uses call.Transport (whose requests are guarded wherever
	// they are sent) or call.Key, or hands call to a function that may.
	var dos []*ast.CallExpr
	transport, key := false, false
	ast.Inspect(body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			for _, arg := range c.Args {
				if id, ok := arg.(*ast.Ident); ok && own[info.Uses[id]] {
					key = true
				}
			}
		}
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id := rootIdent(sel.X); id == nil || !own[info.Uses[id]] || !isPointerTo(info.TypeOf(sel.X), apPath, "ForeignCall") {
			return true
		}
		switch sel.Sel.Name {
		case "Transport":
			transport = true
		case "Key":
			key = true
		}
		return true
	})
	insideDo := func(pos token.Pos) bool {
		for _, d := range dos {
			if len(d.Args) > 1 && d.Args[1].Pos() <= pos && pos < d.Args[1].End() {
				return true
			}
		}
		return false
	}
	ast.Inspect(body, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Do" && isPointerTo(info.TypeOf(sel.X), apPath, "ForeignCall") {
			dos = append(dos, c)
		}
		return true
	})
	ast.Inspect(body, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		checkSQLText(pass, c)
		if what := net.networkCall(info, c); what != "" && !reconcile && !transport && !insideDo(c.Pos()) {
			pass.Reportf(c.Pos(), "%s in a foreign phase outside call.Do: the guard does not see it, so a retry makes it again, and without the downstream key; make it inside call.Do, or through an http.Client whose Transport is call.Transport(nil)", what)
		}
		if lib := retryingClient(info, c); lib != "" {
			pass.Reportf(c.Pos(), "%s retries requests on its own: each retry is a call the foreign phase's guard never sees (a second effect at a downstream without idempotency keys, or a request call.Transport refuses); turn its retries off and let the Runner retry the phase", lib)
		}
		return true
	})
	checkDos(pass, body, dos)
	if !transport && !key && !reconcile {
		for _, d := range dos {
			checkKeyUsed(pass, d)
		}
	}
}

// checkDos reports call.Do in a loop, and two call.Do on one path.
func checkDos(pass *analysis.Pass, body *ast.BlockStmt, dos []*ast.CallExpr) {
	paths := make([][]ast.Node, len(dos))
	for i, d := range dos {
		paths[i], _ = astutil.PathEnclosingInterval(fileOf(pass, body), d.Pos(), d.End())
		for _, n := range paths[i] {
			if n == body {
				break
			}
			switch n.(type) {
			case *ast.ForStmt, *ast.RangeStmt:
				pass.Reportf(d.Pos(), "call.Do in a loop: the guard allows one call per foreign phase, and a second fails the phase permanently; make one call per phase (a retrying client inside it is a second call too)")
			case *ast.FuncLit:
				// A literal inside the phase (call.Do's own function
				// aside) runs when it is called: stop here.
			}
		}
	}
	for i := range dos {
		for j := i + 1; j < len(dos); j++ {
			if !exclusive(paths[i], paths[j], body) {
				pass.Reportf(dos[j].Pos(), "a second call.Do on the same path of a foreign phase (the first at %s): the guard allows one call per phase, and the second fails it permanently; split the calls into foreign phases of their own", pass.Fset.Position(dos[i].Pos()))
			}
		}
	}
}

// exclusive reports whether two calls (given by their enclosing paths,
// innermost first) cannot both run: they sit in different branches of one
// if or switch, or the earlier sits in a block that returns before the
// later is reached.
func exclusive(a, b []ast.Node, body *ast.BlockStmt) bool {
	inB := map[ast.Node]int{}
	for i, n := range b {
		inB[n] = i
	}
	for i, n := range a {
		j, shared := inB[n]
		if !shared {
			continue
		}
		// n is the innermost common ancestor; a[i-1] and b[j-1] are the
		// children of n on each path.
		if i == 0 || j == 0 {
			return false
		}
		ca, cb := a[i-1], b[j-1]
		switch s := n.(type) {
		case *ast.IfStmt:
			if (ca == s.Body && cb == s.Else) || (ca == s.Else && cb == s.Body) {
				return true
			}
		case *ast.BlockStmt:
			if _, isCase := ca.(*ast.CaseClause); isCase && ca != cb {
				return true
			}
			if _, isCase := ca.(*ast.CommClause); isCase && ca != cb {
				return true
			}
		}
		// The earlier call returns before the later one: a block below
		// the common ancestor on a's path that ends in a return.
		for _, m := range a[:i] {
			if blk, ok := m.(*ast.BlockStmt); ok && len(blk.List) > 0 {
				if _, ret := blk.List[len(blk.List)-1].(*ast.ReturnStmt); ret && a[0].Pos() < b[0].Pos() {
					return true
				}
			}
			if cc, ok := m.(*ast.CaseClause); ok && len(cc.Body) > 0 {
				if _, ret := cc.Body[len(cc.Body)-1].(*ast.ReturnStmt); ret && a[0].Pos() < b[0].Pos() {
					return true
				}
			}
		}
		return false
	}
	return false
}

// checkKeyUsed reports a call.Do whose function never uses the
// downstream key it is handed.
func checkKeyUsed(pass *analysis.Pass, d *ast.CallExpr) {
	if len(d.Args) < 2 {
		return
	}
	lit, ok := d.Args[1].(*ast.FuncLit)
	if !ok || lit.Type.Params == nil {
		return
	}
	params := lit.Type.Params.List
	if len(params) == 0 {
		return
	}
	last := params[len(params)-1]
	if len(last.Names) == 0 {
		pass.Reportf(d.Pos(), "call.Do's function ignores the downstream key it is handed (and the phase uses neither call.Key nor call.Transport): without it the downstream cannot tell a retry from a new request; send it as the request's idempotency key")
		return
	}
	name := last.Names[len(last.Names)-1]
	obj := pass.TypesInfo.Defs[name]
	used := false
	ast.Inspect(lit.Body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && obj != nil && pass.TypesInfo.Uses[id] == obj {
			used = true
		}
		return !used
	})
	if !used {
		pass.Reportf(d.Pos(), "call.Do's function ignores the downstream key it is handed (%s; the phase uses neither call.Key nor call.Transport): without it the downstream cannot tell a retry from a new request; send it as the request's idempotency key", name.Name)
	}
}

func fileOf(pass *analysis.Pass, n ast.Node) *ast.File {
	for _, f := range pass.Files {
		if f.Pos() <= n.Pos() && n.End() <= f.End() {
			return f
		}
	}
	return nil
}
