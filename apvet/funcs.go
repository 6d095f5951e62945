package apvet

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// funcs are the functions of the package being checked (declared
// functions and methods, and function literals assigned to a variable),
// with what a phase calling one needs to know of it.
type funcs struct {
	pass   *analysis.Pass
	bodies map[types.Object]*fnBody
	// net are the functions that make network I/O, directly or through
	// another of them: a phase calling one makes that I/O too.
	net map[types.Object]*helper
	// guards are the functions that use the Transport of a
	// *ForeignCall they are given: a phase handing its call to one has
	// its requests guarded by it (a helper building the guarded client).
	guards map[types.Object]bool
}

type fnBody struct {
	params []types.Object // without the receiver
	body   *ast.BlockStmt
}

// helper is a function of the package that makes network I/O.
type helper struct {
	what string
	// params are the function's parameters; reach[i] says whether the
	// i-th reaches the I/O (its argument, receiver or URL), so that a key
	// passed there is sent.
	params []types.Object
	reach  map[int]bool
	// several: it makes more than one request on one path, or one in a
	// loop.
	several bool
}

// callee is the function or function variable call calls, its generic
// origin for an instance.
func (f *funcs) callee(info *types.Info, call *ast.CallExpr) types.Object {
	obj := typeutil.Callee(info, call)
	if fn, ok := obj.(*types.Func); ok {
		return fn.Origin()
	}
	return obj
}

// findFuncs collects the package's functions and computes, each to a fixed
// point, which make network I/O, which of their parameters reach it, which
// make several requests, and which guard a call they are given.
func findFuncs(pass *analysis.Pass) *funcs {
	f := &funcs{pass: pass, bodies: map[types.Object]*fnBody{}, net: map[types.Object]*helper{}, guards: map[types.Object]bool{}}
	info := pass.TypesInfo
	paramsOf := func(ft *ast.FuncType) []types.Object {
		var out []types.Object
		if ft.Params != nil {
			for _, field := range ft.Params.List {
				for _, name := range field.Names {
					out = append(out, info.Defs[name])
				}
				if len(field.Names) == 0 {
					out = append(out, nil)
				}
			}
		}
		return out
	}
	for _, file := range pass.Files {
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.FuncDecl:
				if x.Body != nil {
					f.bodies[info.Defs[x.Name]] = &fnBody{paramsOf(x.Type), x.Body}
				}
			case *ast.AssignStmt:
				for i, r := range x.Rhs {
					lit, ok := r.(*ast.FuncLit)
					if !ok || i >= len(x.Lhs) {
						continue
					}
					if id, ok := x.Lhs[i].(*ast.Ident); ok {
						obj := info.Defs[id]
						if obj == nil {
							obj = info.Uses[id]
						}
						if obj != nil {
							f.bodies[obj] = &fnBody{paramsOf(lit.Type), lit.Body}
						}
					}
				}
			}
			return true
		})
	}

	// Which make network I/O.
	for changed := true; changed; {
		changed = false
		for obj, fb := range f.bodies {
			if f.net[obj] != nil {
				continue
			}
			if rs := f.requests(info, fb.body); len(rs) > 0 {
				f.net[obj] = &helper{what: rs[0].what, params: fb.params, reach: map[int]bool{}}
				changed = true
			}
		}
	}
	// Which of their parameters reach it, and which make several requests.
	for changed := true; changed; {
		changed = false
		for obj, h := range f.net {
			body := f.bodies[obj].body
			rs := f.requests(info, body)
			for i, p := range h.params {
				if h.reach[i] || p == nil {
					continue
				}
				t := newTaint(info, ownCalls(h.params))
				t.add(p, "")
				t.spread(body)
				for _, r := range rs {
					if t.reaches(r) {
						h.reach[i] = true
						changed = true
						break
					}
				}
			}
			if !h.several && len(severalRequests(f.pass, body, rs)) > 0 {
				h.several = true
				changed = true
			}
		}
	}
	// Which guard a call they are given.
	for changed := true; changed; {
		changed = false
		for obj, fb := range f.bodies {
			if f.guards[obj] {
				continue
			}
			calls := ownCalls(fb.params)
			if len(calls) > 0 && f.guarded(info, fb.body, calls) {
				f.guards[obj] = true
				changed = true
			}
		}
	}
	return f
}

// ownCalls are the *ForeignCall parameters among params.
func ownCalls(params []types.Object) map[types.Object]bool {
	out := map[types.Object]bool{}
	for _, p := range params {
		if p != nil && isPointerTo(p.Type(), apPath, "ForeignCall") {
			out[p] = true
		}
	}
	return out
}

// guarded reports whether body sends requests through the Transport of one
// of calls: it uses call.Transport, or hands call to a function that does
// (or to one of another package, which may).
func (f *funcs) guarded(info *types.Info, body ast.Node, calls map[types.Object]bool) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && calls[info.Uses[id]] && x.Sel.Name == "Transport" {
				found = true
			}
		case *ast.CallExpr:
			for _, a := range x.Args {
				if id, ok := ast.Unparen(a).(*ast.Ident); ok && calls[info.Uses[id]] {
					callee := f.callee(info, x)
					_, local := f.bodies[callee]
					if f.guards[callee] || (!local && !isMethodOf(callee, apPath, "ForeignCall") && !standard(callee)) {
						found = true
					}
				}
			}
		}
		return !found
	})
	return found
}

// standard reports whether obj belongs to the standard library (fmt.Sprint
// given call guards nothing), or to no package.
func standard(obj types.Object) bool {
	if obj == nil || obj.Pkg() == nil {
		return true
	}
	first, _, _ := strings.Cut(obj.Pkg().Path(), "/")
	return !strings.Contains(first, ".")
}

// isMethodOf reports whether obj is a method of path.name or *path.name.
func isMethodOf(obj types.Object, path, name string) bool {
	fn, ok := obj.(*types.Func)
	if !ok {
		return false
	}
	recv := fn.Type().(*types.Signature).Recv()
	return recv != nil && (isNamed(recv.Type(), path, name) || isPointerTo(recv.Type(), path, name))
}
