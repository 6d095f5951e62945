// Package atomicphase is a stub of the real package's API, for apvet's
// tests: the names and types apvet recognises, nothing more.
package atomicphase

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
)

type Tx interface {
	pgx.Tx
	Queue(sql string, args ...any)
}

type Outcome struct{}

func Continue() Outcome                       { return Outcome{} }
func Respond(status int, body []byte) Outcome { return Outcome{} }

type ForeignCall struct{}

func (c *ForeignCall) Do(ctx context.Context, fn func(ctx context.Context, key string) error) error {
	return nil
}
func (c *ForeignCall) Key() string                                        { return "" }
func (c *ForeignCall) Transport(base http.RoundTripper) http.RoundTripper { return base }

type LocalFunc[S any] func(ctx context.Context, tx Tx, state *S) (Outcome, error)
type CallFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) error
type ReconcileFunc[S any] func(ctx context.Context, call *ForeignCall, state *S) (bool, error)

type Phase[S any] struct{}

func Local[S any](name string, fn LocalFunc[S]) Phase[S]                         { return Phase[S]{} }
func Foreign[S any](name string, call CallFunc[S], record LocalFunc[S]) Phase[S] { return Phase[S]{} }
func (p Phase[S]) WithReconcile(fn ReconcileFunc[S]) Phase[S]                    { return p }

func Permanent(err error) error { return err }
