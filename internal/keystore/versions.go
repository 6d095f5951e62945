package keystore

import (
	"context"
	"errors"
	"fmt"
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
// A version recorded with another shape (its phase list) is not touched,
// and no row is returned.
//
// It writes current_seen_at with seen_at, the two equal, and keeps in
// older_seen_at a seen_at it finds that differs from current_seen_at:
// written by a release that sets seen_at alone (one older than
// atomicphase_releases), which a contract step waits for
// (OlderReleaseSeen). Told by difference, not order: such a release's
// statement may take its now() before this one's and write after it.
//
// With it, the process's release: that a release needing migration $5 is
// live (atomicphase_releases).
const announceSQL = `
WITH release AS (
    INSERT INTO /* TEMPLATE: schema */atomicphase_releases AS r (needs) VALUES ($5::integer)
    ON CONFLICT (needs) DO UPDATE SET seen_at = now()
)
INSERT INTO /* TEMPLATE: schema */atomicphase_workflow_versions AS v (workflow, version, shape, phases, current_seen_at)
VALUES ($1::text, $2::text, $3::text, $4::text[], now())
ON CONFLICT (workflow, version) DO UPDATE SET seen_at = now(), phases = EXCLUDED.phases, current_seen_at = now(),
    older_seen_at = ` + olderSeenAt + `
    WHERE v.shape = EXCLUDED.shape
RETURNING true`

// olderSeenAt is what an announcement leaves in older_seen_at: the row's
// seen_at if an older release wrote it last (the later of the two), else
// what it held.
const olderSeenAt = `CASE WHEN v.seen_at IS DISTINCT FROM v.current_seen_at THEN greatest(v.seen_at, v.older_seen_at) ELSE v.older_seen_at END`

// olderReleaseSeenSQL tells when a process of a release that needs a
// migration before $1 was last seen, if within $2 microseconds: one
// recorded in atomicphase_releases, or one older than that table, told by
// the versions it announced.
const olderReleaseSeenSQL = `
SELECT max(at) FROM (
    SELECT seen_at FROM /* TEMPLATE: schema */atomicphase_releases WHERE needs < $1::integer
    UNION ALL
    SELECT greatest(v.older_seen_at, CASE WHEN v.seen_at IS DISTINCT FROM v.current_seen_at THEN v.seen_at END)
    FROM /* TEMPLATE: schema */atomicphase_workflow_versions AS v
) AS s(at)
WHERE at > now() - $2::bigint * interval '1 microsecond'`

// OlderReleaseSeen returns when a process of a release that needs a
// migration before needs was last seen, if it was within window, or the
// zero time. A database without the registry (a fresh one) has seen none.
func OlderReleaseSeen(ctx context.Context, db DB, schema string, needs int, window time.Duration) (time.Time, error) {
	var exists bool
	if err := db.QueryRow(ctx, tableExistsSQL, qualifiedName(schema, "atomicphase_releases")).Scan(&exists); err != nil || !exists {
		return time.Time{}, err
	}
	var at *time.Time
	if err := db.QueryRow(ctx, Render(olderReleaseSeenSQL, schema), needs, window.Microseconds()).Scan(&at); err != nil {
		return time.Time{}, err
	}
	if at == nil {
		return time.Time{}, nil
	}
	return *at, nil
}

// ErrVersionShape is Announce's error for a version another process
// recorded with another phase list.
var ErrVersionShape = errors.New("another process recorded this workflow version with another phase list")

// versionDrainedSQL tells whether no unfinished key (parked ones
// included) started under a workflow version. It reads every shard of a
// distributed key table, and runs only when a version's name is claimed
// by another phase list.
const versionDrainedSQL = `
SELECT NOT EXISTS (SELECT 1 FROM ` + unfinishedKeys + ` AS u
                   WHERE workflow = $1::text AND workflow_version = $2::text)`

// reclaimVersionSQL gives a version's name to another phase list, when no
// process has recorded the version within the horizon (checked again here,
// so that a process that came back meanwhile keeps it).
const reclaimVersionSQL = `
UPDATE /* TEMPLATE: schema */atomicphase_workflow_versions AS v
SET shape = $3::text, phases = $4::text[], seen_at = now(), current_seen_at = now(),
    older_seen_at = ` + olderSeenAt + `
WHERE workflow = $1::text AND version = $2::text AND shape <> $3::text
  AND seen_at < now() - $5::bigint * interval '1 microsecond'
RETURNING true`

// Announce records that this process, whose release needs migration
// needs, runs version of workflow, whose phases are phases and whose
// phase list hashes to shape: ErrVersionShape
// when another process recorded the version with another shape, unless
// that one is gone (no process recorded it within horizon) and drained (no
// unfinished key started under it): its name is then this phase list's.
func (s *Store) Announce(ctx context.Context, db DB, needs int, workflow, version, shape string, phases []string, horizon time.Duration) error {
	var ok bool
	err := db.QueryRow(ctx, s.sql.announce, workflow, version, shape, phases, needs).Scan(&ok)
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	var drained bool
	if err := db.QueryRow(ctx, s.sql.versionDrained, workflow, version).Scan(&drained); err != nil {
		return err
	}
	if drained {
		err = db.QueryRow(ctx, s.sql.reclaimVersion, workflow, version, shape, phases, horizon.Microseconds()).Scan(&ok)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	return fmt.Errorf("workflow %q version %q: %w (it is given to another phase list only once no process has recorded it for Config.VersionHorizon and no unfinished key started under it); declare a new WorkflowOpts.Version for a changed phase list", workflow, version, ErrVersionShape)
}

// undoAttemptSQL takes back the attempt an acquisition counted, fenced by
// the lock token: the key was taken by a process that cannot run it.
const undoAttemptSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys SET attempts = attempts - 1
WHERE scope = $1::text AND idempotency_key = $2::text AND lock_token = $3::bigint AND attempts > 1`

// UndoAttempt takes back the attempt the acquisition under token counted.
func (s *Store) UndoAttempt(ctx context.Context, db DB, scope, key string, token int64) error {
	_, err := db.Exec(ctx, s.sql.undoAttempt, scope, key, token)
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
// workflow and version, up to $3 keys: those the sweep may pick (marked
// due, sweep.go), which it reads from their index; a key that never went
// wrong is held by its own attempt until the watermark passes it.
const otherVersionsSQL = `
SELECT workflow, workflow_version, count(*)::int FROM (
    SELECT workflow, workflow_version FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NOT NULL
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
// workflow version that the sweep may pick (otherVersionsSQL), oldest
// first.
const versionKeysSQL = `
SELECT scope, idempotency_key, workflow FROM /* TEMPLATE: schema */idempotency_keys
WHERE workflow = $1::text AND workflow_version = $2::text
  AND response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NOT NULL
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
           (count(*) FILTER (WHERE unknown_at IS NOT NULL AND parked_at IS NULL AND locked_at IS NULL))::int AS unknown,
           min(created_at) AS oldest
    FROM ` + unfinishedKeys + ` AS u
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
