package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

// connectTimeout bounds connecting when the URL sets no connect_timeout: an
// operator waiting on an unreachable host should hear so soon.
const connectTimeout = 10 * time.Second

// withPool connects to the database the global flags name, runs fn and
// closes the pool.
func (c *cli) withPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	if c.databaseURL == "" {
		return errors.New("no database given: set DATABASE_URL (export DATABASE_URL=postgres://user@localhost:5432/dbname), " +
			"or name a file holding it in DATABASE_URL_FILE; keep the password out of the command line, " +
			"where other users see it: in PGPASSWORD, ~/.pgpass or that file")
	}
	cfg, err := connstr.Parse(c.databaseURL)
	if err != nil {
		return fmt.Errorf("--database-url (or DATABASE_URL): %w (the string is not shown: it may hold a password)", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	cfg.MaxConns = 2
	where := fmt.Sprintf("database %q on %s:%d as %q", cfg.ConnConfig.Database, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.User)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("cannot connect to %s: %w", where, err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("cannot connect to %s: %w; check --database-url (or DATABASE_URL) and that PostgreSQL is running", where, err)
	}
	return fn(pool)
}

// withRunner is withPool with a Runner configured by the global flags, once
// the database has shown it has the schema.
func (c *cli) withRunner(ctx context.Context, fn func(*atomicphase.Runner) error) error {
	return c.withRunnerConfig(ctx, nil, fn)
}

// withRunnerConfig is withRunner with the Runner's configuration taken from
// cfg (nil for the defaults) besides the global flags.
func (c *cli) withRunnerConfig(ctx context.Context, cfg *atomicphase.Config, fn func(*atomicphase.Runner) error) error {
	rc := atomicphase.Config{}
	if cfg != nil {
		rc = *cfg
	}
	rc.Schema, rc.LockTimeout = c.schema, c.lockTimeout
	return c.withPool(ctx, func(pool *pgxpool.Pool) error {
		r, err := atomicphase.NewRunner(pool, &rc)
		if err != nil {
			return &usageError{fmt.Errorf("--schema or --lock-timeout: %w", err)}
		}
		if err := r.CheckSchema(ctx); err != nil {
			return c.explain(err)
		}
		return c.explain(fn(r))
	})
}

// explain rewords the library's errors that every command may meet in
// terms of this command line. Errors about one key are worded by the
// command that knows the key.
func (c *cli) explain(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, atomicphase.ErrSchemaMissing):
		where := "on the connection's search_path"
		if c.schema != "" {
			where = fmt.Sprintf("in schema %q", c.schema)
		}
		return fmt.Errorf("the database has no atomicphase schema %s, or an older one: run `atomicphase migrate` "+
			"with the same --database-url and --schema first\n  detail: %w", where, err)
	case errors.Is(err, atomicphase.ErrSchemaOpen):
		return fmt.Errorf("refused: %w", err)
	case errors.Is(err, atomicphase.ErrStoreUnavailable):
		return fmt.Errorf("lost the database connection: %w; check that PostgreSQL is running and try again", err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("interrupted: %w", err)
	}
	return err
}

// keyNotFound words ErrKeyNotFound for one key.
func keyNotFound(scope, key string) error {
	return fmt.Errorf("no key %q in scope %q: check both (keys are case-sensitive), or list keys with `atomicphase keys --scope %s`",
		key, scope, shellQuote(scope))
}
