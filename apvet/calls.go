package apvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"path/filepath"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/ast/astutil"
)

// A call.Do stands for one call: one request, made while Do runs, carrying
// the downstream key. This file checks what Do's function does.

// checkDo checks the function given to the call.Do d of a foreign phase:
// a request it sends from a goroutine, requests that do not carry the
// key (unless the phase's requests go through call.Transport, which sets
// it), and more than one request.
func checkDo(c *checker, d *ast.CallExpr, t *taint, transport bool) {
	info := c.pass.TypesInfo
	if len(d.Args) < 2 {
		return
	}
	lit, ok := d.Args[1].(*ast.FuncLit)
	if !ok {
		return
	}

	var async []ast.Node
	for _, g := range goroutines(info, lit.Body) {
		if inside(g.at, async) {
			continue
		}
		for _, r := range g.run {
			if rs := c.funcs.requests(info, r); len(rs) > 0 {
				async = append(async, g.at)
				c.report(g.at.Pos(), ruleAsyncCall, "a request sent from a goroutine inside call.Do (%s): it can still be in flight after Do returned, when the Runner takes the call for finished and may record it, or retry it; send it in Do's own goroutine and wait for its answer", rs[0].what)
				break
			}
		}
	}
	var rs []*request
	for _, r := range c.funcs.requests(info, lit.Body) {
		if !inside(r.call, async) {
			rs = append(rs, r)
		}
	}

	if !transport {
		if len(rs) == 0 {
			checkKeyUsed(c, d, lit, t)
		}
		for _, r := range rs {
			if !t.reaches(r) {
				c.report(r.call.Pos(), ruleKey, "%s inside call.Do is not given the downstream key (Do's key, or call.Key()): the downstream cannot tell a retry from a new request, and a retry makes the call again; send the key with it (its idempotency key, or the reference a downstream without keys looks the call up by)", r.what)
			}
		}
	}

	for _, s := range severalRequests(c.pass, lit.Body, rs) {
		c.report(s.at.call.Pos(), ruleOneCall, "%s", s.why)
	}
}

// several is a request that makes one too many in its function.
type several struct {
	at  *request
	why string
}

// severalRequests finds, among the requests rs made in body, each that is
// made in a loop, that follows another on the same path, or that is a
// helper making several itself: a call.Do (or a helper) stands for one
// request, and a retry after the first went out sends them all again (a
// second debit at a downstream without keys).
func severalRequests(pass *analysis.Pass, body *ast.BlockStmt, rs []*request) []several {
	file := fileOf(pass, body)
	if file == nil {
		return nil
	}
	var out []several
	paths := make([][]ast.Node, len(rs))
	for i, r := range rs {
		paths[i], _ = astutil.PathEnclosingInterval(file, r.call.Pos(), r.call.End())
	}
	for j, r := range rs {
		switch {
		case inLoop(paths[j], body):
			out = append(out, several{r, "a request in a loop inside call.Do (" + r.what + "): the guard counts the call once, so a retry after the first request went out sends every one again, and a downstream without keys acts on each; make one request per foreign phase, and let the Runner retry it"})
			continue
		case r.several:
			out = append(out, several{r, r.what + " makes more than one request, inside one call.Do: the guard counts the call once, so a retry after the first request went out sends them all again, and a downstream without keys acts twice; make one request per foreign phase"})
			continue
		}
		for i := range j {
			if !exclusive(paths[i], paths[j], body) {
				out = append(out, several{r, "a second request inside one call.Do, " + r.what + " (the first at " + shortPos(pass, rs[i].call.Pos()) + "): the guard counts the call once, so a retry after the first went out sends both again, and a downstream without keys acts twice (a second debit); split the requests into foreign phases of their own"})
				break
			}
		}
	}
	return out
}

// inLoop reports whether a path (innermost first) passes a loop before it
// reaches body.
func inLoop(path []ast.Node, body ast.Node) bool {
	for _, n := range path {
		if n == body {
			return false
		}
		switch n.(type) {
		case *ast.ForStmt, *ast.RangeStmt:
			return true
		}
	}
	return false
}

// checkKeyUsed reports a call.Do whose function makes no request apvet
// knows of and never uses the downstream key: not the key it is handed,
// nor call.Key(), nor call given to a helper.
func checkKeyUsed(c *checker, d *ast.CallExpr, lit *ast.FuncLit, t *taint) {
	if !t.has(lit.Body) {
		c.report(d.Pos(), ruleKey, "call.Do's function ignores the downstream key it is handed (nor does it use call.Key): without it the downstream cannot tell a retry from a new request; send it as the request's idempotency key")
	}
}

// keyParam returns the variable of the key call.Do's function d is handed,
// or nil.
func keyParam(info *types.Info, d *ast.CallExpr) types.Object {
	if len(d.Args) < 2 {
		return nil
	}
	lit, ok := d.Args[1].(*ast.FuncLit)
	if !ok || lit.Type.Params == nil || len(lit.Type.Params.List) == 0 {
		return nil
	}
	last := lit.Type.Params.List[len(lit.Type.Params.List)-1]
	if len(last.Names) == 0 {
		return nil
	}
	return info.Defs[last.Names[len(last.Names)-1]]
}

// shortPos writes pos as file:line:column, the file without its directory.
func shortPos(pass *analysis.Pass, pos token.Pos) string {
	p := pass.Fset.Position(pos)
	return fmt.Sprintf("%s:%d:%d", filepath.Base(p.Filename), p.Line, p.Column)
}

func fileOf(pass *analysis.Pass, n ast.Node) *ast.File {
	for _, f := range pass.Files {
		if f.Pos() <= n.Pos() && n.End() <= f.End() {
			return f
		}
	}
	return nil
}
