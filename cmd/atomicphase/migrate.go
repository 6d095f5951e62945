package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) migrateCmd() *cobra.Command {
	var citus, scopeCap, allowPublicCreate, contract bool
	var to int
	var liveWithin time.Duration
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the schema migrations the database does not have yet",
		Long: strings.TrimSpace(`
Apply every atomicphase migration the database does not have yet, each in a
transaction of its own, in --schema (created if missing) or on the
connection's search_path, and print the versions applied, or "up to date".

It is what atomicphase.Migrate does at a service's start-up: safe to run
again, and from several places at once (they take turns on an advisory
lock). To apply the SQL with your own migration tool instead, use schema.sql
or the files in migration/ of the library.

With --citus, on a Citus coordinator, it then distributes the key table by
scope and the functions by their scope argument, colocated with it (the
library's docs/scale.md): run it so after every upgrade.

With --scope-cap it also builds the index a service's
Config.MaxUnfinishedPerScope counts with (concurrently: no write waits).
Without it a Runner with a cap fails its CheckSchema; a request that
succeeds first time writes one more index entry with it.

It refuses a database where every role may create objects in the schema
or in a schema on the connection's search_path (schema public, on
PostgreSQL 14 and earlier): such a role could run its own code as whoever
sends the library's statements. Revoke it (REVOKE CREATE ON SCHEMA public
FROM PUBLIC), or pass --allow-public-create for a database no untrusted
role connects to.

Without --contract it applies only the expand steps, which a process of
the previous release keeps working on, and names the contract steps it
left: those that remove what only an older release reads. On a database it
migrates from nothing it applies every step. During an upgrade, roll the
new release out (its start-up Migrate applies the expand steps), then,
once no process of the previous release is left, run migrate --contract.
A contract step refuses, changing nothing, while the versions registry has
seen a process of an older release within --live-within (default 24h).

With --to N it stops after migration N, leaving the later ones for a later
run.`),
		Example: examples(
			`atomicphase migrate`,
			`atomicphase migrate --schema keys --database-url postgres://app@db:5432/app`,
			`atomicphase migrate --citus`,
			`atomicphase migrate --scope-cap`,
			`atomicphase migrate --contract`,
			`atomicphase migrate --contract --live-within 10m`,
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if liveWithin != 0 && !contract {
				return &usageError{fmt.Errorf("--live-within is for a contract step: give it with --contract")}
			}
			return c.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				opts := &atomicphase.MigrateOpts{Schema: c.schema, Citus: citus, ScopeCap: scopeCap, TargetVersion: to,
					AllowPublicCreate: allowPublicCreate, Contract: contract, LiveWithin: liveWithin}
				names := map[int]string{}
				migrations, err := atomicphase.Migrations(opts)
				if err != nil {
					return &usageError{fmt.Errorf("--schema: %w", err)}
				}
				for _, m := range migrations {
					names[m.Version] = m.Name
				}
				applied, err := atomicphase.Migrate(cmd.Context(), pool, opts)
				for _, v := range applied {
					fmt.Fprintf(c.stdout, "applied %03d_%s\n", v, names[v])
				}
				if err != nil {
					return c.explain(err)
				}
				pending, err := atomicphase.PendingMigrations(cmd.Context(), pool, opts)
				if err != nil {
					return c.explain(err)
				}
				latest := 0
				for _, m := range migrations {
					if (to == 0 || m.Version <= to) && !slices.ContainsFunc(pending, func(p atomicphase.Migration) bool { return p.Version == m.Version }) {
						latest = m.Version
					}
				}
				if len(applied) == 0 {
					fmt.Fprintf(c.stdout, "up to date (version %03d)\n", latest)
				} else {
					fmt.Fprintf(c.stdout, "schema at version %03d\n", latest)
				}
				for _, m := range pending {
					if m.Contract && (to == 0 || m.Version <= to) {
						fmt.Fprintf(c.stdout, "contract step %03d_%s left for migrate --contract, once no process of a release that needs a migration before %03d is left\n",
							m.Version, m.Name, m.Needs)
					}
				}
				if citus {
					fmt.Fprintln(c.stdout, "distributed on Citus by scope")
				}
				if scopeCap {
					fmt.Fprintln(c.stdout, "the scope cap's index is built")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&citus, "citus", false, "on a Citus coordinator, also distribute the key table and the functions by scope")
	cmd.Flags().BoolVar(&scopeCap, "scope-cap", false, "also build the index Config.MaxUnfinishedPerScope counts with")
	cmd.Flags().IntVar(&to, "to", 0, "stop after migration `N` (0: apply every migration)")
	cmd.Flags().BoolVar(&contract, "contract", false,
		"also apply the contract steps, which remove what only an older release reads (refused while one was seen within --live-within)")
	cmd.Flags().DurationVar(&liveWithin, "live-within", 0,
		"how recently a process of an older release must have been seen to hold up a contract step (0: "+atomicphase.DefaultVersionHorizon.String()+")")
	cmd.Flags().BoolVar(&allowPublicCreate, "allow-public-create", false,
		"migrate although every role may create objects in the schema or on the search_path (a database no untrusted role connects to)")
	return cmd
}
