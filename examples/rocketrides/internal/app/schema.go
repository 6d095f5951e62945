package app

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
CREATE TABLE IF NOT EXISTS staged_jobs (
    id       bigserial PRIMARY KEY,
    job_name text      NOT NULL,
    job_args jsonb     NOT NULL
);
INSERT INTO users (email, stripe_customer_id) VALUES
    ('user@example.com', 'cus_ok_1'),
    ('user-bad-source@example.com', 'cus_declined_2')
ON CONFLICT (email) DO NOTHING;`

// schemaLockID serialises concurrent start-ups, whose CREATE ... IF NOT
// EXISTS could otherwise collide.
const schemaLockID = 0x726f636b65747264 // "rocketrd"

// Migrate applies the example's schema and seeds, idempotently.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(schemaLockID)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
}
