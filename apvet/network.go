package apvet

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// helpers maps the functions of the package being checked (declared, or
// function literals assigned to a variable) that make network I/O, directly
// or through another such helper, to what they call: a phase calling one
// makes that I/O too.
type helpers map[types.Object]string

// findHelpers computes the package's helpers, to a fixed point.
func findHelpers(pass *analysis.Pass) helpers {
	bodies := map[types.Object]*ast.BlockStmt{}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.FuncDecl:
				if x.Body != nil {
					bodies[pass.TypesInfo.Defs[x.Name]] = x.Body
				}
			case *ast.AssignStmt:
				for i, r := range x.Rhs {
					lit, ok := r.(*ast.FuncLit)
					if !ok || i >= len(x.Lhs) {
						continue
					}
					if id, ok := x.Lhs[i].(*ast.Ident); ok {
						obj := pass.TypesInfo.Defs[id]
						if obj == nil {
							obj = pass.TypesInfo.Uses[id]
						}
						if obj != nil {
							bodies[obj] = lit.Body
						}
					}
				}
			}
			return true
		})
	}
	h := helpers{}
	for changed := true; changed; {
		changed = false
		for obj, body := range bodies {
			if _, done := h[obj]; done {
				continue
			}
			ast.Inspect(body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if what := h.networkCall(pass.TypesInfo, c); what != "" {
						h[obj] = what
						changed = true
						return false
					}
				}
				return true
			})
		}
	}
	return h
}

// networkCall names the network I/O call makes, or "" when it makes none
// apvet knows of: net/http's requests, net's dials, gRPC's invocations, the
// context-taking methods of known SDK clients (Stripe, AWS), and the
// package's own helpers that make one of those.
func (h helpers) networkCall(info *types.Info, call *ast.CallExpr) string {
	if id := rootIdent(call.Fun); id != nil && id == call.Fun {
		if what, ok := h[info.Uses[id]]; ok {
			return id.Name + " (which calls " + what + ")"
		}
	}
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil || fn.Pkg() == nil {
		return ""
	}
	path, name := fn.Pkg().Path(), fn.Name()
	sig := fn.Type().(*types.Signature)
	recv := ""
	if sig.Recv() != nil {
		t := sig.Recv().Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := types.Unalias(t).(*types.Named); ok {
			recv = n.Obj().Name()
		} else if _, ok := t.Underlying().(*types.Interface); ok {
			recv = "interface"
		}
	}
	qualified := path + "." + name
	if recv != "" {
		qualified = path + ".(" + recv + ")." + name
	}
	switch path {
	case "net/http":
		switch {
		case recv == "" && (name == "Get" || name == "Post" || name == "PostForm" || name == "Head"):
			return "http." + name
		case recv == "Client" && (name == "Do" || name == "Get" || name == "Post" || name == "PostForm" || name == "Head"):
			return "(*http.Client)." + name
		case (recv == "Transport" || recv == "RoundTripper") && name == "RoundTrip":
			return "http." + recv + ".RoundTrip"
		}
	case "net":
		if strings.HasPrefix(name, "Dial") || strings.HasPrefix(name, "Lookup") {
			return qualified
		}
	case "net/smtp":
		if name == "SendMail" || name == "Dial" {
			return qualified
		}
	case "google.golang.org/grpc":
		if recv == "ClientConn" && (name == "Invoke" || name == "NewStream") {
			return "(*grpc.ClientConn)." + name
		}
	}
	for _, sdk := range []string{"github.com/stripe/stripe-go/", "github.com/aws/aws-sdk-go-v2/service/"} {
		if strings.HasPrefix(path, sdk) && recv != "" && takesContext(sig) {
			return qualified
		}
	}
	return ""
}

func takesContext(sig *types.Signature) bool {
	return sig.Params().Len() > 0 && isNamed(sig.Params().At(0).Type(), "context", "Context")
}

// retryingClient names the self-retrying HTTP client call uses, or "".
func retryingClient(info *types.Info, call *ast.CallExpr) string {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil || fn.Pkg() == nil {
		return ""
	}
	path := fn.Pkg().Path()
	for _, c := range []string{"github.com/hashicorp/go-retryablehttp", "github.com/go-resty/resty"} {
		if strings.HasPrefix(path, c) {
			return path
		}
	}
	return ""
}

// checkGoroutines reports a go statement in a phase whose function uses
// the phase's transaction.
func checkGoroutines(pass *analysis.Pass, body *ast.BlockStmt, tx map[types.Object]bool) {
	ast.Inspect(body, func(n ast.Node) bool {
		g, ok := n.(*ast.GoStmt)
		if !ok {
			return true
		}
		ast.Inspect(g.Call, func(m ast.Node) bool {
			if id, ok := m.(*ast.Ident); ok && tx[pass.TypesInfo.Uses[id]] {
				pass.Reportf(g.Pos(), "a goroutine in a phase uses the phase's transaction (%s): it may still run after the phase committed or rolled back, and a transaction is not safe for concurrent use; use tx in the phase's own goroutine", id.Name)
				return false
			}
			return true
		})
		return true
	})
}
