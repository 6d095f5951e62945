package apvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/types/typeutil"
)

// goroutine is a place in a phase that starts a goroutine: a go statement,
// or the Go method of a sync.WaitGroup or an errgroup.Group. at is where
// it is reported; run is what runs in the goroutine (the go statement's
// call with its arguments, or the function given to Go).
type goroutine struct {
	at  ast.Node
	run []ast.Node
}

// goroutines lists the goroutines started in body, outermost first.
func goroutines(info *types.Info, body ast.Node) []goroutine {
	var out []goroutine
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.GoStmt:
			out = append(out, goroutine{at: x, run: []ast.Node{x.Call}})
		case *ast.CallExpr:
			if startsGoroutine(info, x) {
				run := make([]ast.Node, len(x.Args))
				for i, a := range x.Args {
					run[i] = a
				}
				out = append(out, goroutine{at: x, run: run})
			}
		}
		return true
	})
	return out
}

// startsGoroutine reports whether call is sync.WaitGroup.Go or
// errgroup.Group.Go (golang.org/x/sync/errgroup), which run their function
// in a goroutine of their own.
func startsGoroutine(info *types.Info, call *ast.CallExpr) bool {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil || fn.Name() != "Go" {
		return false
	}
	recv := fn.Type().(*types.Signature).Recv()
	return recv != nil && (isPointerTo(recv.Type(), "sync", "WaitGroup") ||
		isPointerTo(recv.Type(), "golang.org/x/sync/errgroup", "Group"))
}

// inside reports whether n lies within one of nodes.
func inside(n ast.Node, nodes []ast.Node) bool {
	for _, m := range nodes {
		if m.Pos() <= n.Pos() && n.End() <= m.End() {
			return true
		}
	}
	return false
}

// checkGoroutines reports, once each, the goroutines in a phase that use
// the phase's transaction.
func checkGoroutines(c *checker, body *ast.BlockStmt, tx map[types.Object]bool) {
	info := c.pass.TypesInfo
	reported := map[ast.Node]bool{}
	for _, g := range goroutines(info, body) {
		if inside(g.at, keys(reported)) {
			continue // a goroutine inside one already reported
		}
		var used *ast.Ident
		for _, r := range g.run {
			ast.Inspect(r, func(m ast.Node) bool {
				if id, ok := m.(*ast.Ident); ok && used == nil && tx[info.Uses[id]] {
					used = id
				}
				return used == nil
			})
		}
		if used != nil {
			reported[g.at] = true
			c.report(g.at.Pos(), ruleTxGoroutine, "a goroutine in a phase uses the phase's transaction (%s): it may still run after the phase committed or rolled back, and a transaction is not safe for concurrent use; use %s in the phase's own goroutine", used.Name, used.Name)
		}
	}
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
