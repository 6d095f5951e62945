// Package pgx is a stub of pgx's API, for apvet's tests.
package pgx

import "context"

type Row interface{ Scan(dest ...any) error }

type Rows interface {
	Close()
	Next() bool
	Scan(dest ...any) error
	Err() error
}

type Tx interface {
	Begin(ctx context.Context) (Tx, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	SendBatch(ctx context.Context, b *Batch) BatchResults
	Conn() *Conn
}

type Conn struct{}

func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (int64, error) { return 0, nil }
func (c *Conn) Query(ctx context.Context, sql string, args ...any) (Rows, error) { return nil, nil }
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) Row        { return nil }
func (c *Conn) Begin(ctx context.Context) (Tx, error)                            { return nil, nil }
func (c *Conn) SendBatch(ctx context.Context, b *Batch) BatchResults             { return nil }

// Batch queues statements to send in one round trip.
type Batch struct{}

type QueuedQuery struct{}

func (b *Batch) Queue(sql string, args ...any) *QueuedQuery { return &QueuedQuery{} }
func (b *Batch) Len() int                                   { return 0 }

type BatchResults interface {
	Exec() (int64, error)
	QueryRow() Row
	Close() error
}

func BeginFunc(ctx context.Context, db interface {
	Begin(ctx context.Context) (Tx, error)
}, fn func(Tx) error) error {
	return nil
}
