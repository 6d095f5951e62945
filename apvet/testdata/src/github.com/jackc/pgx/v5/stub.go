// Package pgx is a stub of pgx's API, for apvet's tests.
package pgx

import "context"

type Row interface{ Scan(dest ...any) error }

type Tx interface {
	Begin(ctx context.Context) (Tx, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Conn() *Conn
}

type Conn struct{}

func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (int64, error) { return 0, nil }
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) Row        { return nil }
func (c *Conn) Begin(ctx context.Context) (Tx, error)                            { return nil, nil }

func BeginFunc(ctx context.Context, db interface {
	Begin(ctx context.Context) (Tx, error)
}, fn func(Tx) error) error {
	return nil
}
