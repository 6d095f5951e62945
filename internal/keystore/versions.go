package keystore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Workflow versions: each key records the version of the workflow
// definition it started under (workflow_version, set by the statement that
// records it), and each process records the versions it runs in
// atomicphase_workflow_versions (migration 011).

// VersionRef is how a (workflow, version) pair is written in the
// statements' arrays.
func VersionRef(workflow, version string) string { return workflow + "\x1f" + version }

// announceSQL records that a process runs a workflow version, or that it
// still does.
const announceSQL = `
INSERT INTO /* TEMPLATE: schema */atomicphase_workflow_versions AS v (workflow, version, phases)
VALUES ($1::text, $2::text, $3::text[])
ON CONFLICT (workflow, version) DO UPDATE SET seen_at = now(), phases = EXCLUDED.phases`

// Announce records that this process runs version of workflow, whose
// phases are phases.
func (s *Store) Announce(ctx context.Context, db DB, workflow, version string, phases []string) error {
	_, err := db.Exec(ctx, s.sql.announce, workflow, version, phases)
	return err
}

// deployedSQL lists the versions of a workflow some process announced
// within a horizon.
const deployedSQL = `
SELECT version, phases FROM /* TEMPLATE: schema */atomicphase_workflow_versions
WHERE workflow = $1::text AND seen_at > now() - $2::bigint * interval '1 microsecond'`

// Deployed returns the versions of workflow some process announced within
// horizon, with their phases.
func (s *Store) Deployed(ctx context.Context, db DB, workflow string, horizon time.Duration) (map[string][]string, error) {
	rows, err := db.Query(ctx, s.sql.deployed, workflow, horizon.Microseconds())
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	var version string
	var phases []string
	_, err = pgx.ForEachRow(rows, []any{&version, &phases}, func() error {
		out[version] = phases
		return nil
	})
	return out, err
}

// otherVersionsSQL counts the unfinished, unparked keys of the given
// workflows recorded under versions other than the given ones, per
// workflow and version, up to $3 keys.
const otherVersionsSQL = `
SELECT workflow, workflow_version, count(*)::int FROM (
    SELECT workflow, workflow_version FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NULL
      AND workflow = ANY($1::text[]) AND workflow_version IS NOT NULL
      AND workflow || chr(31) || workflow_version <> ALL($2::text[])
    LIMIT $3) AS other
GROUP BY workflow, workflow_version ORDER BY workflow, workflow_version`

// VersionCount is a number of keys of one workflow version.
type VersionCount struct {
	Workflow, Version string
	N                 int
}

// OtherVersions counts the unfinished, unparked keys of workflows recorded
// under versions other than versions (VersionRef pairs), counting at most
// limit keys.
func (s *Store) OtherVersions(ctx context.Context, db DB, workflows, versions []string, limit int) ([]VersionCount, error) {
	rows, err := db.Query(ctx, s.sql.otherVersions, workflows, versions, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (VersionCount, error) {
		var c VersionCount
		return c, row.Scan(&c.Workflow, &c.Version, &c.N)
	})
}

// versionKeysSQL lists at most $3 unfinished, unparked keys of one
// workflow version, oldest first.
const versionKeysSQL = `
SELECT scope, idempotency_key, workflow FROM /* TEMPLATE: schema */idempotency_keys
WHERE workflow = $1::text AND workflow_version = $2::text
  AND response_status IS NULL AND parked_at IS NULL
ORDER BY created_at
LIMIT $3::integer`

// VersionKeys returns at most limit unfinished, unparked keys of version
// of workflow, oldest first.
func (s *Store) VersionKeys(ctx context.Context, db DB, workflow, version string, limit int) ([]Ref, error) {
	rows, err := db.Query(ctx, s.sql.versionKeys, workflow, version, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Ref, error) {
		var k Ref
		return k, row.Scan(&k.Scope, &k.Key, &k.Workflow)
	})
}

// versionsSQL lists, per workflow and version, the announced versions and
// the unfinished keys: how many, how many parked, how many waiting on an
// unknown outcome, and the oldest's creation.
const versionsSQL = `
WITH keys AS (
    SELECT workflow, coalesce(workflow_version, '') AS version, count(*)::int AS unfinished,
           (count(*) FILTER (WHERE parked_at IS NOT NULL))::int AS parked,
           (count(*) FILTER (WHERE unknown_at IS NOT NULL))::int AS unknown,
           min(created_at) AS oldest
    FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL
    GROUP BY 1, 2)
SELECT coalesce(k.workflow, v.workflow), coalesce(k.version, v.version),
       coalesce(v.phases, '{}'), v.registered_at, v.seen_at,
       coalesce(k.unfinished, 0), coalesce(k.parked, 0), coalesce(k.unknown, 0), k.oldest
FROM keys k FULL JOIN /* TEMPLATE: schema */atomicphase_workflow_versions v
    ON v.workflow = k.workflow AND v.version = k.version
ORDER BY 1, 2`

// VersionStatus is one workflow version: as announced (zero times when
// never), and its unfinished keys. Version "" stands for keys recorded
// without one.
type VersionStatus struct {
	Workflow, Version           string
	Phases                      []string
	RegisteredAt, SeenAt        *time.Time
	Unfinished, Parked, Unknown int
	Oldest                      *time.Time
}

// Versions lists every announced workflow version and every version with
// unfinished keys.
func (s *Store) Versions(ctx context.Context, db DB) ([]VersionStatus, error) {
	rows, err := db.Query(ctx, s.sql.versions)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (VersionStatus, error) {
		var v VersionStatus
		return v, row.Scan(&v.Workflow, &v.Version, &v.Phases, &v.RegisteredAt, &v.SeenAt,
			&v.Unfinished, &v.Parked, &v.Unknown, &v.Oldest)
	})
}
