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
// against the same database is safe; one statement each, as Citus needs
// for DDL on a distributed table. Every table a request writes carries the
// rider, the user's email, which is the request's scope: on Citus those
// tables are distributed by it, colocated with the key table (see
// distribute), and their keys include it.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS users (
    id                 bigserial PRIMARY KEY,
    email              text      NOT NULL UNIQUE,
    stripe_customer_id text      NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS rides (
    id               bigserial,
    rider            text             NOT NULL,
    created_at       timestamptz      NOT NULL DEFAULT now(),
    idempotency_key  text             NOT NULL,
    user_id          bigint           NOT NULL REFERENCES users,
    origin_lat       double precision NOT NULL,
    origin_lon       double precision NOT NULL,
    target_lat       double precision NOT NULL,
    target_lon       double precision NOT NULL,
    stripe_charge_id text,
    bank_payout_id   text,
    PRIMARY KEY (rider, id)
)`,
	`CREATE INDEX IF NOT EXISTS rides_user_key_idx ON rides (rider, idempotency_key)`,
	`CREATE TABLE IF NOT EXISTS audit_records (
    id            bigserial,
    rider         text        NOT NULL,
    action        text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    data          jsonb       NOT NULL,
    resource_id   bigint      NOT NULL,
    resource_type text        NOT NULL,
    user_id       bigint      NOT NULL REFERENCES users,
    PRIMARY KEY (rider, id)
)`,
	// The receipts' transactional outbox: the booking's last phase adds the
	// ride's receipt here, in the transaction that stores its 201, and the
	// relay hands it to River (see Receipts).
	`CREATE TABLE IF NOT EXISTS receipt_outbox (
    rider     text        NOT NULL,
    ride_id   bigint      NOT NULL,
    recipient text        NOT NULL,
    charge_id text        NOT NULL,
    key       text        NOT NULL,
    queued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (rider, ride_id)
)`,
	`INSERT INTO users (email, stripe_customer_id) VALUES
    ('user@example.com', 'cus_ok_1'),
    ('user-bad-source@example.com', 'cus_declined_2')
ON CONFLICT (email) DO NOTHING`,
}

// distribution places the tables on Citus (docs/scale.md): users, small
// and read by every booking, is a reference table, copied to every node;
// the tables a booking writes are distributed by rider, colocated with
// the key table, so that each phase of a booking runs on the worker that
// holds its key and commits there alone. River's own tables stay on the
// coordinator: they are never written in a booking's transaction (the
// outbox is), so they cost it no second node.
var distribution = []struct{ table, sql string }{
	{"users", `SELECT create_reference_table('users')`},
	{"rides", `SELECT create_distributed_table('rides', 'rider', colocate_with := 'idempotency_keys')`},
	{"audit_records", `SELECT create_distributed_table('audit_records', 'rider', colocate_with := 'idempotency_keys')`},
	{"receipt_outbox", `SELECT create_distributed_table('receipt_outbox', 'rider', colocate_with := 'idempotency_keys')`},
}

// schemaLockID serialises concurrent start-ups, whose CREATE ... IF NOT
// EXISTS could otherwise collide, and whose River migrations (which take no
// lock of their own) could otherwise both run.
const schemaLockID = 0x726f636b65747264 // "rocketrd"

// SchemaID names what Migrate creates: the example's own schema revision and
// River's newest migration. A test harness that keeps migrated template
// databases (atomicphasetest.Options.SetupID) gets a new one when either
// changes, a River upgrade included.
func SchemaID() string {
	id := "rocketrides-v4"
	if m, err := rivermigrate.New(riverpgxv5.New(nil), nil); err == nil {
		if all := m.AllVersions(); len(all) > 0 {
			id += fmt.Sprintf("-river%03d", all[len(all)-1].Version)
		}
	}
	return id
}

// Migrate applies the example's schema and seeds, distributes its tables
// when the database is a Citus coordinator (atomicphase's key table must be
// distributed already: atomicphase.MigrateOpts.Citus), then River's
// migrations (the receipts' job table), idempotently, under a session
// advisory lock held on a connection of its own.
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
		for _, stmt := range schema {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if citus, err := OnCitus(ctx, conn.Conn()); err != nil {
		return err
	} else if citus {
		if err := distribute(ctx, conn.Conn()); err != nil {
			return fmt.Errorf("distribute on Citus: %w", err)
		}
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

// OnCitus reports whether the database has the citus extension: a Citus
// coordinator, whose tables the example distributes.
func OnCitus(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var citus bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus)
	return citus, err
}

// distribute places the tables a Citus coordinator does not place yet, one
// statement at a time outside a transaction block, as Citus prefers.
func distribute(ctx context.Context, conn *pgx.Conn) error {
	for _, d := range distribution {
		// Placed means distributed (hash) or a reference table: making
		// users a reference table turns the tables referencing it into
		// Citus local tables, on the coordinator, which still need
		// distributing.
		var placed bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition
			WHERE logicalrelid = $1::regclass AND (partmethod = 'h' OR repmodel = 't'))`,
			d.table).Scan(&placed); err != nil {
			return err
		}
		if placed {
			continue
		}
		if _, err := conn.Exec(ctx, d.sql); err != nil {
			return fmt.Errorf("%s: %w", d.sql, err)
		}
	}
	return nil
}
