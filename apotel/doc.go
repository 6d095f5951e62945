// Package apotel reports what atomicphase decides as OpenTelemetry metrics
// and traces. It is a module of its own, so that atomicphase itself does not
// require OpenTelemetry: only a program that imports apotel links it.
//
//	obs, err := apotel.New(nil) // the global providers
//	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{Observer: obs})
//
// The Runner and its Sweeper then report every decision to obs, which
// counts it and adds it to the request's span. The workflow and phase are
// recorded; the scope and key, which are the user's data, reach spans only
// with Options.RecordKeys, and then as Config.RedactKey leaves them.
//
// # Levels
//
// The counters count transitions. RegisterLevels adds observable gauges of
// the levels themselves, read from the key table (Runner.KeyLevels) when
// the metrics are collected, at most once per LevelsOptions.MinInterval:
//
//   - LevelsMetric, atomicphase.keys.unfinished ({key}): unfinished keys now, by
//     workflow and status (in_progress, stale, abandoned, unknown, parked).
//     Alert on any parked key.
//   - OldestMetric, atomicphase.keys.oldest_age (s): the oldest of them, by workflow and
//     status. Alert on unknown keys whose oldest age keeps growing.
//
// # Metrics
//
// Every event kind is a counter named MetricPrefix + the kind. Each decision
// is counted once, by one (or by Event.Count for the events about many
// keys). Attributes: AttrWorkflow when the event names a workflow (reaping
// and a Resume's store errors do not), and AttrPhase when it
// names a phase. The meter is named after this package.
//
// Acquisition: what became of each request's key. Every Run that reaches
// the key store counts under exactly one of created, replay, in_progress,
// key_misuse, failed_retry, takeover and over_limit, or store.error; a
// Resume that takes its key counts as failed_retry.
//
//   - atomicphase.reserve.created ({request}): a new key was recorded and
//     its first attempt began. The rate of new work; no alert of its own.
//   - atomicphase.reserve.replay ({request}): a finished key's stored
//     response was replayed. Clients retrying after success; a replay rate
//     near the created rate means clients time out before phases end.
//   - atomicphase.reserve.in_progress ({request}): refused, another attempt
//     holds the key (409). Alert when it stays above a few percent of
//     created: clients retry faster than phases finish, or attempts stall
//     holding their locks.
//   - atomicphase.reserve.key_misuse ({request}): refused, the key was
//     first used with another request (422). A client bug (a key reused
//     across requests); alert on a sustained rate.
//   - atomicphase.reserve.failed_retry ({request}): an unfinished key that
//     no attempt held (its last attempt failed, or it was parked) was taken
//     by a client retry or by Resume, the sweep's resumes included. It
//     follows phase.failed; no alert of its own.
//   - atomicphase.reserve.takeover ({request}): a key was taken from an
//     attempt whose lock had gone stale: the holder died, or ran longer than
//     Config.LockTimeout. Expected after crashes and deploys; alert on a rate
//     without them, and see lock.lost.
//   - atomicphase.reserve.over_limit ({request}): refused, the scope has
//     Config.MaxUnfinishedPerScope unfinished keys (429). Alert on a
//     sustained rate: a caller spraying keys, or keys that do not finish.
//   - atomicphase.reserve.unknown ({request}): a call to a downstream
//     without idempotency keys failed after it may have been sent; its
//     outcome is unknown until reconciled. A rise means the downstream is
//     failing or slow.
//
// Reconciliation of unknown outcomes (docs/unknown-outcomes.md):
//
//   - atomicphase.reconcile.scheduled ({key}): a key whose call's outcome
//     is unknown was released to be reconciled later, by the sweep or a
//     retry. It follows reserve.unknown.
//   - atomicphase.reconcile.resolved_happened ({key}): reconciliation found
//     the call took effect; its result is recorded and the call is not made
//     again.
//   - atomicphase.reconcile.resolved_not_happened ({key}): reconciliation
//     found the call did not take effect; it is made.
//   - atomicphase.reconcile.failed ({key}): the reconcile function could
//     not tell. Alert on a sustained rate: the downstream's lookup is down,
//     and its keys park after Config.MaxAttempts.
//
// Failures:
//
//   - atomicphase.store.error ({error}): a statement on the key store
//     failed (the database unreachable, the schema missing). Alert when it
//     is above zero for minutes.
//   - atomicphase.phase.failed ({phase}; workflow, phase): a phase failed
//     and rolled back, whatever the reason: its own error, a permanent
//     error, a lost lock. Alert on failed / (committed + failed) per phase
//     above its usual level: a downstream is failing.
//   - atomicphase.lock.lost ({attempt}; workflow, phase): an attempt found
//     at commit that a newer attempt had taken its key, and rolled back (it
//     is a phase.failed too). Alert on any: a phase ran longer than
//     Config.LockTimeout, which should be raised.
//   - atomicphase.key.parked ({key}; workflow, phase when the key failed in
//     one): a key was parked for an operator, by a permanent error or after
//     Config.MaxAttempts. Alert on any: it waits for a person (ListKeys,
//     Unpark, Forget).
//   - atomicphase.key.parked_reaped ({key}; workflow): the sweep deleted a
//     parked key nobody acted on within SweepConfig.ParkedRetention. Alert
//     on any: a parked key went unattended.
//   - atomicphase.reserve.parked ({request}; workflow): a retry of a parked
//     key, answered with its failure without running anything.
//   - atomicphase.key.data_refused ({request}; workflow, phase): the
//     database refused a request's data (a constraint, a value out of
//     range); the key finished with a stored 422. A rise: a client sends
//     bad data, or a constraint changed.
//
// Progress:
//
//   - atomicphase.phase.committed ({phase}; workflow, phase): a phase
//     committed. With phase.failed, the phase error ratio.
//   - atomicphase.phase.duration (s, histogram; workflow, phase, outcome
//     "committed" or "failed"): how long a phase took, foreign call and
//     transaction retries included. Alert when a phase's p99 nears
//     Config.LockTimeout: past it, the phase's key is taken over under it.
//
// The sweep (with the workflow, except for reaping):
//
//   - atomicphase.zombie_key ({key}): the sweep completed an abandoned key,
//     whose client stopped retrying. Expected after crashes; a steady rate
//     means clients give up before their keys finish.
//   - atomicphase.ttl_pruned ({key}): finished keys deleted after their
//     retention, by Event.Count. It should follow created a retention
//     later; zero while keys are created means no sweep runs and the key
//     table grows.
//   - atomicphase.sweep.unknown_workflow ({key}): each sweep adds the
//     abandoned keys (up to 1000) whose workflow this process has not
//     registered, so the same keys count again on every sweep. Alert on any
//     increase: a workflow was removed or renamed while keys of it remain,
//     or a process sweeps without registering every workflow.
//
// An event kind added to atomicphase later is counted the same way, under
// MetricPrefix + its kind, from its first event on, with unit {event}.
//
// # Traces
//
// Every Run and Resume is a span named RequestSpanName ("atomicphase.request"),
// with AttrWorkflow (a Resume's once its key is read); every phase a child
// span named PhaseSpanPrefix + the phase ("atomicphase.phase charge"), with
// AttrWorkflow and AttrPhase. With Options.RecordKeys both also carry
// AttrScope and AttrKey. A span that ends with an error records it and has
// status Error; that includes a request's final refusals (in progress, key
// misuse, over the limit).
//
// Error text (a span's status, its exception event, an event's AttrError)
// is what the Runner hands over: as Config.RedactError rewrote it, the one
// hook every error text goes through (the stored last error, the log, the
// console). Without it, phase errors are recorded as they are, and may
// quote what a client sent.
//
// Every decision is also a span event, named like its metric, with what the
// event says as attributes: on the request span the acquisition decision,
// a lost lock, a parked key; on each phase's span its committed or failed
// event. The sweep's events go to the span of the context given to
// Sweeper.Run or RunOnce, if any.
package apotel
