package apvet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/ast/astutil"
)

// checkForeign checks a function taking a *atomicphase.ForeignCall call: a
// foreign phase's call, or its reconcile function, whose lookup is made
// outside call.Do by design.
func checkForeign(c *checker, body *ast.BlockStmt, call *types.Var, reconcile bool) {
	info := c.pass.TypesInfo
	checkHandles(c, body, nil, "", "that makes a foreign call: a foreign phase holds no transaction, so what it writes there commits on its own and a retry writes it again; record the call's result in the phase's record step, through its tx")
	own := derived(info, body, call)

	// The phase's requests are guarded wherever they are sent when it uses
	// call.Transport, or hands call to a function that does.
	transport := c.funcs.guarded(info, body, own)
	var dos []*ast.CallExpr
	ast.Inspect(body, func(n ast.Node) bool {
		if x, ok := n.(*ast.CallExpr); ok {
			if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Do" && isPointerTo(info.TypeOf(sel.X), apPath, "ForeignCall") {
				dos = append(dos, x)
			}
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
		x, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		checkSQLText(c, x)
		if r := c.funcs.requestOf(info, x); r != nil && !reconcile && !transport && !insideDo(x.Pos()) {
			c.report(x.Pos(), ruleUnguardedIO, "%s in a foreign phase outside call.Do: the guard does not see it, so a retry makes it again, and without the downstream key; make it inside call.Do, or through an http.Client whose Transport is call.Transport(nil)", r.what)
		}
		if lib := retryingClient(info, x); lib != "" {
			c.report(x.Pos(), ruleRetryingClient, "%s retries requests on its own: each retry is a call the foreign phase's guard never sees (a second effect at a downstream without idempotency keys, or a request call.Transport refuses); turn its retries off and let the Runner retry the phase", lib)
		}
		return true
	})
	checkDos(c, body, dos)
	if reconcile {
		return
	}
	// The key: what each Do's function is handed, and call.Key(), followed
	// through the whole phase (a reference taken before Do).
	t := newTaint(info, own)
	for _, d := range dos {
		if k := keyParam(info, d); k != nil {
			t.add(k, "")
		}
	}
	t.spread(body)
	for _, d := range dos {
		checkDo(c, d, t, transport)
	}
}

// checkDos reports call.Do in a loop, and two call.Do on one path.
func checkDos(c *checker, body *ast.BlockStmt, dos []*ast.CallExpr) {
	paths := make([][]ast.Node, len(dos))
	for i, d := range dos {
		paths[i], _ = astutil.PathEnclosingInterval(fileOf(c.pass, body), d.Pos(), d.End())
		if inLoop(paths[i], body) {
			c.report(d.Pos(), ruleOneCall, "call.Do in a loop: the guard allows one call per foreign phase, and a second fails the phase permanently; make one call per phase (a retrying client inside it is a second call too)")
		}
	}
	for i := range dos {
		for j := i + 1; j < len(dos); j++ {
			if !exclusive(paths[i], paths[j], body) {
				c.report(dos[j].Pos(), ruleOneCall, "a second call.Do on the same path of a foreign phase (the first at %s): the guard allows one call per phase, and the second fails it permanently; split the calls into foreign phases of their own", shortPos(c.pass, dos[i].Pos()))
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
