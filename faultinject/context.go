package faultinject

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

// FaultHeader is the request header HeaderMiddleware reads rules from, in
// Parse's syntax.
const FaultHeader = "Atomicphase-Fault"

type ctxKey struct{}

// WithInjector returns ctx carrying inj, which a ContextInjector applies to
// the attempt running under ctx.
func WithInjector(ctx context.Context, inj *Injector) context.Context {
	return context.WithValue(ctx, ctxKey{}, inj)
}

// ContextInjector is an atomicphase.FaultInjector that applies the injector
// carried by each attempt's context (see WithInjector), falling back to
// Base, so one Runner can take a different fault per request.
type ContextInjector struct {
	// Base applies when the context carries no injector; it may be nil.
	Base atomicphase.FaultInjector
}

// InjectFault implements atomicphase.FaultInjector.
func (c *ContextInjector) InjectFault(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	if inj, ok := ctx.Value(ctxKey{}).(*Injector); ok {
		return inj.InjectFault(ctx, at, conn)
	}
	if c.Base != nil {
		return c.Base.InjectFault(ctx, at, conn)
	}
	return nil
}

// HeaderMiddleware lets a test driver choose the faults of each request: it
// parses the Atomicphase-Fault header (Parse's syntax) into an injector on
// the request's context, for a Runner configured with a ContextInjector.
// admin is the pool terminate-backend kills through. A malformed header is
// answered 400. It is a test hook: never enable it where clients you do not
// control can reach the server.
func HeaderMiddleware(admin *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		spec := r.Header.Get(FaultHeader)
		if spec == "" {
			next.ServeHTTP(w, r)
			return
		}
		rules, err := Parse(spec)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		inj := New(rules...)
		inj.Admin = admin
		next.ServeHTTP(w, r.WithContext(WithInjector(r.Context(), inj)))
	})
}
