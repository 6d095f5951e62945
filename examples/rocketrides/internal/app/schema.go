package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// schema is the example's own tables, created if missing, so a restart
// against the same database is safe.
const schema = `
CREATE TABLE IF NOT EXISTS users (
    id                 bigserial PRIMARY KEY,
    email              text      NOT NULL UNIQUE,
    stripe_customer_id text      NOT NULL
);
CREATE TABLE IF NOT EXISTS rides (
    id               bigserial        PRIMARY KEY,
    created_at       timestamptz      NOT NULL DEFAULT now(),
    idempotency_key  text             NOT NULL,
    user_id          bigint           NOT NULL REFERENCES users,
    origin_lat       double precision NOT NULL,
    origin_lon       double precision NOT NULL,
    target_lat       double precision NOT NULL,
    target_lon       double precision NOT NULL,
    stripe_charge_id text
);
ALTER TABLE rides ADD COLUMN IF NOT EXISTS bank_payout_id text;
CREATE INDEX IF NOT EXISTS rides_user_key_idx ON rides (user_id, idempotency_key);
CREATE TABLE IF NOT EXISTS audit_records (
    id            bigserial   PRIMARY KEY,
    action        text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    data          jsonb       NOT NULL,
    resource_id   bigint      NOT NULL,
    resource_type text        NOT NULL,
    user_id       bigint      NOT NULL REFERENCES users
);
INSERT INTO users (email, stripe_customer_id) VALUES
    ('user@example.com', 'cus_ok_1'),
    ('user-bad-source@example.com', 'cus_declined_2')
ON CONFLICT (email) DO NOTHING;`

// schemaLockID serialises concurrent start-ups, whose CREATE ... IF NOT
// EXISTS could otherwise collide, and whose River migrations (which take no
// lock of their own) could otherwise both run.
const schemaLockID = 0x726f636b65747264 // "rocketrd"

// SchemaID names what Migrate creates: the example's own schema revision and
// River's newest migration. A test harness that keeps migrated template
// databases (atomicphasetest.Options.SetupID) gets a new one when either
// changes, a River upgrade included.
func SchemaID() string {
	id := "rocketrides-v3"
	if m, err := rivermigrate.New(riverpgxv5.New(nil), nil); err == nil {
		if all := m.AllVersions(); len(all) > 0 {
			id += fmt.Sprintf("-river%03d", all[len(all)-1].Version)
		}
	}
	return id
}

// Migrate applies the example's schema and seeds, then River's migrations
// (the receipts' job table), idempotently, under a session advisory lock
// held on a connection of its own.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(schemaLockID)); err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", int64(schemaLockID)); uerr != nil {
			_ = conn.Conn().Close(uctx) // a closed session holds no lock
			err = errors.Join(err, uerr)
		}
	}()
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, schema)
		return err
	}); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	return nil
}
