package apvet

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/types/typeutil"
)

// networkIO names the network I/O call makes itself, or "" when it makes
// none apvet knows of: net/http's requests, net's dials, gRPC's
// invocations, the context-taking methods of known SDK clients (Stripe,
// AWS).
func networkIO(info *types.Info, call *ast.CallExpr) string {
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

// retryingClient names the self-retrying HTTP client whose request call
// sends (go-retryablehttp's Client, resty's Request), or "".
func retryingClient(info *types.Info, call *ast.CallExpr) string {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil || fn.Pkg() == nil || fn.Type().(*types.Signature).Recv() == nil {
		return ""
	}
	switch fn.Name() {
	case "Do", "Get", "Head", "Post", "PostForm", "Put", "Patch", "Delete", "Execute", "Send":
	default:
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

// request is a call in a function that makes network I/O: the I/O itself,
// or a call of one of the package's helpers that make it.
type request struct {
	call *ast.CallExpr
	what string // as reported: "http.Post", "charge (which calls (*http.Client).Do)"
	// keyed are the expressions through which the downstream key can reach
	// the request: the I/O's arguments and receiver, or the arguments a
	// helper passes on to its own I/O.
	keyed []ast.Expr
	// several: the helper makes more than one request on one path.
	several bool
}

// requestOf describes call as a request, or returns nil when it is none.
func (f *funcs) requestOf(info *types.Info, call *ast.CallExpr) *request {
	if what := networkIO(info, call); what != "" {
		keyed := append([]ast.Expr(nil), call.Args...)
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
			keyed = append(keyed, sel.X)
		}
		return &request{call: call, what: what, keyed: keyed}
	}
	h := f.net[f.callee(info, call)]
	if h == nil {
		return nil
	}
	r := &request{call: call, what: types.ExprString(call.Fun) + " (which calls " + h.what + ")", several: h.several}
	for i, a := range call.Args {
		if h.reach[min(i, len(h.params)-1)] {
			r.keyed = append(r.keyed, a)
		}
	}
	return r
}

// requests lists the requests made in n, in source order.
func (f *funcs) requests(info *types.Info, n ast.Node) []*request {
	var out []*request
	ast.Inspect(n, func(m ast.Node) bool {
		if c, ok := m.(*ast.CallExpr); ok {
			if r := f.requestOf(info, c); r != nil {
				out = append(out, r)
			}
		}
		return true
	})
	return out
}
