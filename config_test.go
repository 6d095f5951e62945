package atomicphase_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestNewRunnerValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{LockTimeout: -time.Second, MaxKeyLength: -1, RetryBackoff: -1})
	require.ErrorContains(t, err, "Config.LockTimeout")
	require.ErrorContains(t, err, "Config.MaxKeyLength")
	require.ErrorContains(t, err, "Config.RetryBackoff")
	_, err = atomicphase.NewRunner(nil, nil)
	require.Error(t, err)
}

func TestNewRunnerValidatesSchemaName(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: strings.Repeat("s", 64)})
	require.ErrorContains(t, err, "invalid config")
	require.ErrorContains(t, err, "Config.Schema")
	require.ErrorContains(t, err, "longer than 63 bytes")
	_, err = atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: "tab\there"})
	require.ErrorContains(t, err, "Config.Schema")
	require.ErrorContains(t, err, "printable ASCII")
	_, err = atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: strings.Repeat("s", 63)})
	require.NoError(t, err, "63 bytes is PostgreSQL's limit, inclusive")
}

// runInSchema takes a key through everything a Runner does with the store:
// a new key whose foreign phase fails, Inspect, Resume, and replays. The
// key's row must end up in schema and nowhere else.
func runInSchema(t *testing.T, b *testBundle, runner *atomicphase.Runner, schema string) {
	t.Helper()
	var c counters
	fail := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		if fail {
			return errors.New("down")
		}
		return call.Do(ctx, func(context.Context, string) error { s.ChargeID = "ch_s"; return nil })
	}})

	_, err := runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	info, err := runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint)
	require.False(t, info.Locked)

	fail = false
	resp, err := runner.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.False(t, resp.Replayed)

	replay, err := runner.Run(b.ctx, wf, asRetry(orderRequest("u", "k")))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, resp.Body, replay.Body)
	replay, err = runner.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, []int32{1, 2, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()})

	info, err = runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.RecoveryPointFinished, info.RecoveryPoint)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM "+pgx.Identifier{schema, "idempotency_keys"}.Sanitize()))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'idempotency_keys' AND c.relkind = 'r'`), "the key table exists only in %q", schema)
}

func TestConfigSchemaRunsInThatSchema(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Schema: "billing"})
	require.NoError(t, err)
	billing, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: "billing"})
	require.NoError(t, err)

	require.NoError(t, billing.CheckSchema(b.ctx))
	err = b.runner.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing, "the default schema has no key table")
	require.ErrorContains(t, err, "search_path")
	other, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: "ledger"})
	require.NoError(t, err)
	err = other.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	require.ErrorContains(t, err, `MigrateOpts.Schema "ledger"`)

	runInSchema(t, b, billing, "billing")

	var c counters
	_, err = b.runner.Run(b.ctx, orderWorkflow(t, &c, hooks{}), orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing, "a Runner on the default schema does not find billing's keys")
}

// TestConfigSchemaNameIsQuoted uses a schema name that is only valid quoted:
// upper case, a space and a double quote.
func TestConfigSchemaNameIsQuoted(t *testing.T) {
	t.Parallel()
	const schema = `Billing "EU" 2026`
	b := setupDB(t, unmigratedDBOpts, nil)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Schema: schema})
	require.NoError(t, err)
	require.Len(t, applied, len(migrations(t, nil)))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema))

	runner, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, runner.CheckSchema(b.ctx))
	runInSchema(t, b, runner, schema)

	again, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Schema: schema})
	require.NoError(t, err)
	require.Empty(t, again, "the ledger in the quoted schema is found again")
}

func TestReservedSchemaNameIsRefused(t *testing.T) {
	t.Parallel()
	_, err := atomicphase.NewRunner(&pgxpool.Pool{}, &atomicphase.Config{Schema: "pg_keys"})
	require.ErrorContains(t, err, "reserves")
	_, err = atomicphase.Migrate(context.Background(), nil, &atomicphase.MigrateOpts{Schema: "pg_keys"})
	require.ErrorContains(t, err, "reserves")
}

// A dollar in a schema name would end the migrations' dollar-quoted
// function bodies early.
func TestSchemaNameWithDollarIsRefused(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: "a$$b"})
	require.ErrorContains(t, err, "may not contain $")
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Schema: "a$$b"})
	require.ErrorContains(t, err, "may not contain $", "the migrations' bodies are dollar-quoted")
}

func TestSchemaNamesNeedingQuotes(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"Billing Keys", `we"ird`, "a.b", "x;drop", "a*/b", "select"} {
		b := setupDB(t, unmigratedDBOpts, nil)
		_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Schema: schema})
		if err != nil {
			t.Errorf("%q: migrate: %v", schema, err)
			continue
		}
		r, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{Schema: schema})
		require.NoError(t, err)
		if err := r.CheckSchema(b.ctx); err != nil {
			t.Errorf("%q: check: %v", schema, err)
		}
		type st struct{}
		wf := atomicphase.MustWorkflow("q", startEmpty[st], []atomicphase.Phase[st]{
			atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
				return atomicphase.Respond(200, []byte("ok")), nil
			}),
		}, nil)
		if _, err := r.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"}); err != nil {
			t.Errorf("%q: run: %v", schema, err)
		}
		if _, err := r.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"}); err != nil {
			t.Errorf("%q: replay: %v", schema, err)
		}
		ms := migrations(t, &atomicphase.MigrateOpts{Schema: schema})
		for i := len(ms) - 1; i >= 0; i-- {
			if _, err := b.db.Pool.Exec(b.ctx, ms[i].Down); err != nil {
				t.Errorf("%q: down %d: %v", schema, ms[i].Version, err)
			}
		}
	}
}
