// Package atomicphase makes multi-step, side-effecting request handlers safe
// to retry, on PostgreSQL: a request identified by an idempotency key runs as
// an ordered list of atomic phases, each one database transaction holding at
// most one foreign side effect, and a retry resumes from the last phase that
// committed — or replays the stored response byte for byte.
//
// # Declaring the work
//
// A Workflow is a name and an ordered list of phases over a state type S, a
// JSON-serialisable struct that is committed with every phase, so later
// phases (and later retries) see what earlier ones produced:
//
//	type ride struct {
//		Origin   string `json:"origin"`
//		RideID   int64  `json:"ride_id"`
//		ChargeID string `json:"charge_id"`
//	}
//
//	var createRide = atomicphase.MustWorkflow("create_ride", startRide, []atomicphase.Phase[ride]{
//		atomicphase.Local("create_ride", insertRide),          // database only
//		atomicphase.Foreign("charge", chargeCard, recordCharge), // one foreign call
//		atomicphase.Local("send_receipt", stageReceipt),       // responds
//	}, nil)
//
// A Local phase gets the phase's transaction (a Tx: a pgx.Tx plus Queue, for
// writes sent with the commit) and *S. A Foreign phase makes its one call
// with no transaction or pooled connection held, through a ForeignCall that
// carries a downstream idempotency key derived from the workflow, scope, key
// and phase; then its record function stores the result in the phase's
// transaction. A phase returns Continue (the default), JumpTo a later phase,
// or Respond with the final status and body. Consecutive local phases, and a
// foreign phase's record step with the local phases after it, share one
// transaction (phase fusion): a request commits once per foreign call, plus
// once.
//
// # Running a request
//
// Apply the schema once with Migrate (or schema.sql), then:
//
//	runner, err := atomicphase.NewRunner(pool, nil)
//	err = runner.CheckSchema(ctx) // ErrSchemaMissing: run Migrate
//	resp, err := runner.Run(ctx, createRide, atomicphase.Request{
//		Scope: userID, Key: idempotencyKey,
//		Method: "POST", Path: "/rides", Params: body,
//	})
//
// The first attempt reads the key (one round trip), records it with its
// first phase, runs the phases and stores the response with the last one. A
// concurrent attempt gets ErrInProgress (at once, or once the first
// transaction commits); a finished key replays (resp.Replayed); a key reused
// with another request gets ErrFingerprintMismatch. A phase that fails rolls
// back and unlocks the key, and the next attempt resumes at that phase. An
// attempt that died holding the lock is taken over after Config.LockTimeout,
// and the lock token it no longer holds keeps it from committing anything
// more (fencing).
//
// Retryable tells the final answers (a malformed key or request, a key reused
// with another request) from everything a retry with the same key may
// change. Resume continues an unfinished key with no request at hand, for a
// background completer. Inspect reads a key's state.
//
// # Reading the code
//
// The root package is the API and the engine, one concept per file; the
// key table's SQL lives in internal/keystore and canonical JSON in
// internal/fingerprint. A request goes down the files in this order:
//
//   - runner.go: the Runner and its registry of workflows;
//   - run.go: Run checks the request (request.go), fingerprints it
//     (fingerprint.go), and chooses its way in once: runNew records a new
//     key with its first unit, runExisting acquires any other key in one
//     statement (lock.go); refusal.go explains a key not taken (a replay, a
//     mismatch, a parked key, a key in progress);
//   - attempt.go: an attempt holds the key and runs from its recovery point
//     (recovery_point.go), and fails a run, releasing the key (lock.go);
//   - fusion.go: the attempt's loop, unit by unit: a foreign phase's call
//     (foreign_call.go, or reconcile.go when an earlier call may have gone
//     out), the local phases on one transaction (phase_tx.go, with its
//     savepoints in savepoint.go), routed by
//     their outcome (outcome.go), committed with the recovery point
//     (recovery_point.go); a failed unit is classified (classify.go), and a
//     refusal of the request's data ends it with a stored 422
//     (data_refusal.go); a call and a unit hold the key's lease, renewed
//     while they run (lease.go).
//
// Beside the path: resume.go (Resume), inspect.go (Inspect), operator.go
// (ListKeys, Unpark, Forget, RecordResolution), parked.go (ForgetKeys,
// UnparkKeys, ReapParked), console.go (KeyLevels, ListKeyPage and the rest
// an operator's console reads; the apui package serves one), audit.go (the
// operators' audit trail), downstream_lookup.go (FindDownstreamKey),
// versions.go (which definition runs a key: its version's), sweep.go
// (the Sweeper and Reap), classify.go (what a store or phase error
// means), errors.go, config.go, observer.go, fault.go, migrate.go,
// exec_mode_check.go and citus.go. The "code,
// file by file" section of docs/concepts.md walks it in more detail.
//
// # Testing
//
// The atomicphasetest package hands tests a real, migrated PostgreSQL
// database and a real phase transaction for a phase's unit test
// (BeginPhase, RunPhase), and its explorer runs a workflow through every
// fault point × action of every attempt and checks its invariants after
// each. The apvet analyzer (its own module) checks workflows statically. The faultinject package is
// what a running server links: it crashes runs at named fault points, in
// process or as a real process kill, as ATOMICPHASE_FAULTS says.
package atomicphase
