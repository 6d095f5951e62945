// Package apvet is a static check of atomicphase workflows, built on
// golang.org/x/tools/go/analysis. It finds, in the functions a workflow
// runs as phases, the mistakes that break the guarantee a run cannot
// show until the wrong crash comes. Each finding names its rule:
//
//   - handle: a database handle other than the phase's tx (a
//     *pgxpool.Pool, a *pgx.Conn, a *sql.DB, …), or a query wrapper built
//     on one (sqlc's *Queries made by New(pool) rather than q.WithTx(tx)),
//     used in a phase: what it writes commits on its own, outside the
//     phase's transaction, and a retry writes it again;
//   - tx-control: transaction control on tx.Conn() (pgx.BeginFunc on it,
//     Begin on it) or in SQL text sent through the phase (COMMIT, …);
//   - local-io: network I/O (net/http, net, known SDK clients, and the
//     package's functions and methods that make it) in a local phase,
//     where it runs inside a transaction and is repeated by every retry;
//   - unguarded-io: the same in a foreign phase outside call.Do, when the
//     phase's requests do not go through call.Transport (used in the phase
//     or by a helper it hands call to);
//   - one-call: more than one call.Do on one path of a foreign phase,
//     call.Do in a loop, or more than one request (or one in a loop) inside
//     one call.Do: the guard counts one call per phase;
//   - async-call: a request sent from a goroutine inside call.Do, which can
//     be in flight after Do returned;
//   - key: a request made inside call.Do that is not given the downstream
//     key (Do's key or call.Key(), followed through variables and the
//     package's helpers), when the phase does not use call.Transport;
//   - retrying-client: an HTTP client that retries on its own
//     (go-retryablehttp, resty) in a foreign phase;
//   - tx-goroutine: a goroutine (a go statement, sync.WaitGroup.Go,
//     errgroup.Group.Go) in a phase that uses the phase's tx, which may
//     outlive the phase and is not safe for concurrent use;
//   - tx-stored: the tx stored where it outlives the phase.
//
// A finding is suppressed, with a reason, by a comment on its line or the
// line above: //apvet:ignore RULE REASON. A suppression that suppresses
// nothing is reported (rule ignore), so none outlives its finding.
//
// A phase is recognised by its signature: a function taking an
// atomicphase.Tx is a local phase (or a foreign phase's record step); one
// taking a *atomicphase.ForeignCall is a foreign phase's call (or its
// reconcile function). The check sees the function's own body and the
// function literals inside it; of the functions it calls, it follows the
// package's own for network I/O and the key, not for database handles: a
// helper that takes the pool and is called from a phase is not followed
// (pass it the tx instead). SQL text is checked where it is a constant.
package apvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Analyzer is apvet's analysis.
var Analyzer = &analysis.Analyzer{
	Name:     "apvet",
	Doc:      "check atomicphase workflows for mistakes that break the exactly-once guarantee (see package apvet)",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

const apPath = "github.com/atomicphase/atomicphase"

// checker is one package's check: its functions and its findings.
type checker struct {
	*reporter
	pass  *analysis.Pass
	funcs *funcs
}

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	c := &checker{reporter: newReporter(pass), pass: pass, funcs: findFuncs(pass)}
	ins.Preorder([]ast.Node{(*ast.FuncDecl)(nil), (*ast.FuncLit)(nil)}, func(n ast.Node) {
		var sig *types.Signature
		var body *ast.BlockStmt
		switch fn := n.(type) {
		case *ast.FuncDecl:
			if obj, ok := pass.TypesInfo.Defs[fn.Name].(*types.Func); ok {
				sig, _ = obj.Type().(*types.Signature)
			}
			body = fn.Body
		case *ast.FuncLit:
			sig, _ = pass.TypesInfo.TypeOf(fn).(*types.Signature)
			body = fn.Body
		}
		if sig == nil || body == nil {
			return
		}
		for i := range sig.Params().Len() {
			p := sig.Params().At(i)
			switch {
			case isNamed(p.Type(), apPath, "Tx"):
				checkLocal(c, body, p)
				return
			case isPointerTo(p.Type(), apPath, "ForeignCall"):
				// A reconcile function answers (happened bool, err): its
				// lookup is made outside call.Do by design.
				reconcile := sig.Results().Len() == 2 && types.Identical(sig.Results().At(0).Type(), types.Typ[types.Bool])
				checkForeign(c, body, p, reconcile)
				return
			}
		}
	})
	c.flush()
	return nil, nil
}

// isNamed reports whether t is the named type path.name.
func isNamed(t types.Type, path, name string) bool {
	n, ok := types.Unalias(t).(*types.Named)
	if !ok {
		return false
	}
	obj := n.Obj()
	return obj.Name() == name && obj.Pkg() != nil && obj.Pkg().Path() == path
}

func isPointerTo(t types.Type, path, name string) bool {
	p, ok := types.Unalias(t).(*types.Pointer)
	return ok && isNamed(p.Elem(), path, name)
}

// rootIdent returns the identifier an expression is built on
// (tx in tx.Conn().Exec, s in s.pool), or nil.
func rootIdent(e ast.Expr) *ast.Ident {
	for {
		switch x := e.(type) {
		case *ast.Ident:
			return x
		case *ast.SelectorExpr:
			e = x.X
		case *ast.CallExpr:
			e = x.Fun
		case *ast.ParenExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		default:
			return nil
		}
	}
}
