package apvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"slices"
	"strings"
)

// taint follows the downstream key through a function: which variables,
// and which of their fields, hold it or something made from it (the
// request whose header was set to it, the body marshalled from a map
// holding it). It is flow-insensitive, as a reader is: what is assigned
// anywhere in the function counts everywhere in it.
type taint struct {
	info *types.Info
	// held maps a variable to the paths below it that hold the key: ""
	// for the variable itself, ".Ref" for its field Ref.
	held map[types.Object][]string
	// calls are the function's *ForeignCall variables: call.Key() is the
	// key, and so is what a function given call returns (a helper that
	// derives the reference a call is looked up by).
	calls map[types.Object]bool
}

func newTaint(info *types.Info, calls map[types.Object]bool) *taint {
	return &taint{info: info, held: map[types.Object][]string{}, calls: calls}
}

// add records that path sel of obj holds the key; it reports whether that
// is news.
func (t *taint) add(obj types.Object, sel string) bool {
	if obj == nil || slices.Contains(t.held[obj], sel) {
		return false
	}
	t.held[obj] = append(t.held[obj], sel)
	return true
}

// path returns the variable and field path e denotes (r.Ref is r and
// ".Ref"; an element of a slice or map counts as the whole), or false
// when e is no such path (a call, a method value, a literal).
func (t *taint) path(e ast.Expr) (types.Object, string, bool) {
	switch x := e.(type) {
	case *ast.Ident:
		obj := t.info.Uses[x]
		if obj == nil {
			obj = t.info.Defs[x]
		}
		if _, ok := obj.(*types.Var); ok {
			return obj, "", true
		}
	case *ast.SelectorExpr:
		if s, ok := t.info.Selections[x]; ok {
			if s.Kind() != types.FieldVal {
				return nil, "", false
			}
			obj, sel, ok := t.path(x.X)
			return obj, sel + "." + x.Sel.Name, ok
		}
		if v, ok := t.info.Uses[x.Sel].(*types.Var); ok { // a package's variable
			return v, "", true
		}
	case *ast.ParenExpr:
		return t.path(x.X)
	case *ast.StarExpr:
		return t.path(x.X)
	case *ast.IndexExpr:
		return t.path(x.X)
	}
	return nil, "", false
}

// holds reports whether path sel of obj holds the key, or contains or is
// part of what does.
func (t *taint) holds(obj types.Object, sel string) bool {
	for _, h := range t.held[obj] {
		if h == sel || strings.HasPrefix(h, sel+".") || strings.HasPrefix(sel, h+".") {
			return true
		}
	}
	return false
}

// has reports whether e carries the key: it mentions a path that holds it,
// call.Key(), or a function given call.
func (t *taint) has(e ast.Node) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if found {
			return false
		}
		switch x := n.(type) {
		case *ast.Ident, *ast.SelectorExpr:
			if obj, sel, ok := t.path(x.(ast.Expr)); ok {
				found = t.holds(obj, sel) || t.calls[obj]
				return false
			}
		case *ast.CallExpr:
			for _, a := range x.Args {
				if id, ok := ast.Unparen(a).(*ast.Ident); ok && t.calls[t.info.Uses[id]] {
					found = true
				}
			}
		}
		return true
	})
	return found
}

// spread follows the key through body's assignments (the left side holds
// what the right side carries), through methods called with it (req.Header
// .Set(k, key) puts it in req.Header; v.Set, params.SetIdempotencyKey the
// same) and into the variables whose address a call given it receives
// (fmt.Fprintf(&b, …, key)), until nothing new is found.
func (t *taint) spread(body ast.Node) {
	mark := func(e ast.Expr) bool {
		if id, ok := e.(*ast.Ident); ok && id.Name == "_" {
			return false
		}
		obj, sel, ok := t.path(e)
		return ok && t.add(obj, sel)
	}
	// into marks what a call carrying the key writes it into: the method's
	// receiver, and what the receiver was built on when it is built on the
	// spot (json.NewEncoder(&b).Encode(v), b), the variables whose address
	// the call is given.
	var into func(call *ast.CallExpr) bool
	into = func(call *ast.CallExpr) bool {
		news := false
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
			if _, isPkg := t.info.Uses[identOf(sel.X)].(*types.PkgName); !isPkg {
				if inner, ok := ast.Unparen(sel.X).(*ast.CallExpr); ok {
					news = into(inner) || news
				} else {
					news = mark(sel.X) || news
				}
			}
		}
		for _, a := range call.Args {
			if u, ok := a.(*ast.UnaryExpr); ok && u.Op == token.AND {
				news = mark(u.X) || news
			}
		}
		return news
	}
	for changed := true; changed; {
		changed = false
		ast.Inspect(body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				for i, l := range x.Lhs {
					r := x.Rhs[0]
					if len(x.Rhs) == len(x.Lhs) {
						r = x.Rhs[i]
					}
					if t.has(r) && mark(l) {
						changed = true
					}
				}
			case *ast.ValueSpec:
				for i, name := range x.Names {
					if len(x.Values) == 0 {
						break
					}
					r := x.Values[0]
					if len(x.Values) == len(x.Names) {
						r = x.Values[i]
					}
					if t.has(r) && mark(name) {
						changed = true
					}
				}
			case *ast.RangeStmt:
				if t.has(x.X) {
					for _, e := range []ast.Expr{x.Key, x.Value} {
						if e != nil && mark(e) {
							changed = true
						}
					}
				}
			case *ast.CallExpr:
				carried := false
				for _, a := range x.Args {
					carried = carried || t.has(a)
				}
				if !carried {
					return true
				}
				if into(x) {
					changed = true
				}
			}
			return true
		})
	}
}

func identOf(e ast.Expr) *ast.Ident {
	id, _ := e.(*ast.Ident)
	return id
}

// reaches reports whether the key reaches request r.
func (t *taint) reaches(r *request) bool {
	for _, e := range r.keyed {
		if t.has(e) {
			return true
		}
	}
	return false
}
