package atomicphase

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// What an operator's console reads: the levels of unfinished keys (how many
// stand where, now, not what happened since a dashboard started), the keys
// most recently parked or left with an unknown outcome, and pages of keys
// behind a cursor. Every read here goes to every shard of a distributed key
// table and is meant for operators (apui, the CLI), never a request's path.

// KeyLevel is how many unfinished keys of a workflow have a status now, and
// when the oldest of them was created.
type KeyLevel struct {
	Workflow string
	Status   KeyStatus
	Count    int64
	Oldest   time.Time
}

// LevelFilter narrows KeyLevels and RecentTrouble to one workflow or one
// scope. A nil *LevelFilter reads every key.
type LevelFilter struct {
	// Workflow keeps keys of this workflow. Defaults to any.
	Workflow string
	// Scope keeps keys of this scope. Defaults to any.
	Scope string
}

// KeyLevels counts the unfinished keys by workflow and status (finished
// keys are not counted: EstimateKeys gives the table's size). With an index
// on the unfinished keys (docs/console.md gives it) its cost follows them,
// not the table; without one it reads the table.
func (r *Runner) KeyLevels(ctx context.Context, f *LevelFilter) ([]KeyLevel, error) {
	if f == nil {
		f = &LevelFilter{}
	}
	rows, err := r.store.Levels(ctx, r.pool, f.Workflow, f.Scope)
	if err != nil {
		return nil, storeError("count keys", err)
	}
	out := make([]KeyLevel, len(rows))
	for i, row := range rows {
		out[i] = KeyLevel{Workflow: row.Workflow, Status: KeyStatus(row.Status), Count: row.Count, Oldest: row.Oldest}
	}
	return out, nil
}

// EstimateKeys returns the planner's estimate of how many keys the table
// holds, finished or not, as of its last ANALYZE (autovacuum runs it): a
// size without counting every row. It is -1 before the first ANALYZE (on
// PostgreSQL 13 and older, 0), and on a Citus coordinator, which keeps no
// estimate of distributed tables, 0 or -1.
func (r *Runner) EstimateKeys(ctx context.Context) (int64, error) {
	n, err := r.store.Estimate(ctx, r.pool)
	if err != nil {
		return 0, storeError("estimate keys", err)
	}
	return n, nil
}

// RecentTrouble lists the limit unfinished keys most recently parked or left
// with an unknown outcome, newest first (DefaultListLimit when limit <= 0),
// each read as a list shows it (KeyPageFilter.Brief): Inspect reads one
// whole.
func (r *Runner) RecentTrouble(ctx context.Context, f *LevelFilter, limit int) ([]*KeyInfo, error) {
	if f == nil {
		f = &LevelFilter{}
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	rows, err := r.store.RecentTrouble(ctx, r.pool, f.Workflow, f.Scope, limit)
	if err != nil {
		return nil, storeError("list recent trouble", err)
	}
	return r.keyInfos(rows), nil
}

// KeyCursor is where a page of keys ended; ListKeyPage starts the next page
// after it. Keys are paged in the order (CreatedAt, Scope, Key).
type KeyCursor struct {
	CreatedAt time.Time
	Scope     string
	Key       string
}

// KeyPageFilter selects a page of keys for ListKeyPage: the KeyFilter's
// conditions, and more. A nil *KeyPageFilter lists the first page of keys
// of any status.
type KeyPageFilter struct {
	KeyFilter
	// ErrorContains keeps keys whose last error contains this text, in any
	// case. Defaults to any.
	ErrorContains string
	// Key keeps the keys of this client key: one key when Scope is set too,
	// else the key in every scope that has it (a scan of the table: give the
	// scope where you can). Defaults to any.
	Key string
	// After starts the page after this key. Defaults to the first page.
	After *KeyCursor
	// Brief reads each key as a list shows it, leaving out what a client
	// can make large and no list shows: the State, the stored Response's
	// Header and Body (its Status stays), the RequestPath, and the
	// verdict's ResolvedNote and ResolvedResult. A page then takes memory
	// that follows its length, whatever the keys hold (LastError is
	// bounded when it is stored); Inspect reads a key whole. Defaults to
	// false.
	Brief bool
}

// KeyPage is one page of keys, oldest first.
type KeyPage struct {
	Keys []*KeyInfo
	// Next is where the next page starts; nil on the last page.
	Next *KeyCursor
}

// ListKeyPage lists a page of at most f.Limit keys (DefaultListLimit when
// unset), oldest first, after f.After. Each page is one range of the index
// on created_at after the cursor, however deep it lies (keyset pagination;
// no count and no offset); a filter on an unfinished status uses an index
// on the unfinished keys where there is one (docs/console.md).
func (r *Runner) ListKeyPage(ctx context.Context, f *KeyPageFilter) (*KeyPage, error) {
	if f == nil {
		f = &KeyPageFilter{}
	}
	if err := checkStatus("KeyPageFilter.Status", f.Status); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	kf := &keystore.PageFilter{
		Filter: keystore.Filter{Status: string(f.Status), Workflow: f.Workflow, Scope: f.Scope,
			OlderThan: f.OlderThan, Limit: limit + 1},
		ErrorContains: f.ErrorContains, Key: f.Key, Brief: f.Brief,
	}
	if f.After != nil {
		kf.After = &keystore.Cursor{CreatedAt: f.After.CreatedAt, Scope: f.After.Scope, Key: f.After.Key}
	}
	rows, err := r.store.Page(ctx, r.pool, kf)
	if err != nil {
		return nil, storeError("list keys", err)
	}
	page := &KeyPage{}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		page.Next = &KeyCursor{CreatedAt: last.CreatedAt, Scope: last.Scope, Key: last.Key}
	}
	page.Keys = r.keyInfos(rows)
	return page, nil
}

// WorkflowPhases returns the phase names, in order, of the workflow
// registered (or run) under name in this process, and false when none is:
// its first version registered. A key resumes under its own version's
// definition: WorkflowVersionPhases gives that one.
func (r *Runner) WorkflowPhases(name string) ([]string, bool) {
	wf, ok := r.workflow(name)
	if !ok {
		return nil, false
	}
	steps := wf.phaseSteps()
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.name
	}
	return names, true
}

// WorkflowVersionPhases returns the phase names, in order, of version of
// the workflow name as registered in this process, and false when that
// version is not: what a key's page marks the key's recovery point
// against, since each key resumes under its own version's definition. For
// version "" (a key recorded before versions were) it is WorkflowPhases.
func (r *Runner) WorkflowVersionPhases(name, version string) ([]string, bool) {
	if version == "" {
		return r.WorkflowPhases(name)
	}
	wf, ok := r.workflowVersion(name, version)
	if !ok {
		return nil, false
	}
	steps := wf.phaseSteps()
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.name
	}
	return names, true
}

// RecordedVersionPhases returns the phase names of version of the workflow
// name as the processes that ran it recorded them in the database (the
// versions Runner.Versions lists), and false when none did: what a process
// that has not registered the version (an operator's console, the CLI)
// knows of it. The list holds each phase's former names after it
// (WithFormerNames), and says nothing of which phases are foreign. Version
// "" (keys recorded before versions were) has none recorded.
func (r *Runner) RecordedVersionPhases(ctx context.Context, name, version string) ([]string, bool, error) {
	if version == "" {
		return nil, false, nil
	}
	phases, ok, err := r.store.RecordedPhases(ctx, r.pool, name, version)
	if err != nil {
		return nil, false, storeError("read the recorded workflow versions", err)
	}
	return phases, ok, nil
}

// checkStatus reports a status that is not a key status, naming field.
func checkStatus(field string, s KeyStatus) error {
	if s == "" || slices.Contains(KeyStatuses(), s) {
		return nil
	}
	return fmt.Errorf("atomicphase: %s %q is not a key status; use in_progress, stale, abandoned, unknown, parked or finished", field, s)
}

// keyInfos converts the key store's rows.
func (r *Runner) keyInfos(rows []*keystore.Info) []*KeyInfo {
	out := make([]*KeyInfo, len(rows))
	for i, row := range rows {
		out[i] = r.keyInfo(row)
	}
	return out
}
