package faultinject_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

var chargeCommit = atomicphase.FaultPoint{Workflow: "shop", Phase: "charge", Place: atomicphase.BeforeCommit}

func TestContextInjectorPrefersTheContextsInjector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := faultinject.New(faultinject.Rule{Place: atomicphase.BeforeCommit, Action: faultinject.Crash, Times: -1})
	ci := &faultinject.ContextInjector{Base: base}
	require.ErrorIs(t, ci.InjectFault(ctx, chargeCommit, nil), atomicphase.ErrCrashed, "no injector on the context: Base applies")

	perRequest := faultinject.New(faultinject.Rule{Phase: "charge", Place: atomicphase.BeforeCommit, Action: faultinject.Error})
	ctx = faultinject.WithInjector(ctx, perRequest)
	require.ErrorIs(t, ci.InjectFault(ctx, chargeCommit, nil), faultinject.ErrInjected)
	require.NoError(t, ci.InjectFault(ctx, chargeCommit, nil), "the request's rule fired once; Base is not consulted")

	require.NoError(t, (&faultinject.ContextInjector{}).InjectFault(context.Background(), chargeCommit, nil), "no Base, no injector: nothing")
}

func TestHeaderMiddleware(t *testing.T) {
	t.Parallel()
	var got error
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = (&faultinject.ContextInjector{}).InjectFault(r.Context(), chargeCommit, nil)
		w.WriteHeader(http.StatusNoContent)
	})
	h := faultinject.HeaderMiddleware(nil, next)
	serve := func(header string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/orders", nil)
		if header != "" {
			req.Header.Set(faultinject.FaultHeader, header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	require.Equal(t, http.StatusNoContent, serve("").Code)
	require.NoError(t, got, "no header, no fault")

	require.Equal(t, http.StatusNoContent, serve("shop/charge:before-commit:error").Code)
	require.ErrorIs(t, got, faultinject.ErrInjected, "the header's rule applies to that request")

	rec := serve("charge:whenever:error")
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), `unknown place "whenever"`)
}
