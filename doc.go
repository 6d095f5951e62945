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
// internal/fingerprint. A request goes down the files in this order, each
// calling only the files after it and the utilities beside them:
//
//   - run.go: Run, and the way in, chosen once: runNew records a new key
//     with its first unit, runExisting acquires any other key in one
//     statement;
//   - request.go and fingerprint.go: the request checked and fingerprinted;
//   - versions.go: which registered definition runs the request, and the
//     key;
//   - start_errors.go: the initial state, from the workflow's start function;
//   - lock.go: the key taken, under a lock token;
//   - refusal.go: a key not taken, explained (a replay, a mismatch, a parked
//     key, a key in progress);
//   - attempt.go: an attempt holds the key and resumes at its recovery point;
//   - fusion.go: the attempt's loop, unit by unit; then foreign_call.go (a
//     foreign phase's call), reconcile.go (when an earlier call may have
//     gone out), lease.go (the lease a call and a unit hold), outcome.go (a
//     phase's outcome routed), data_refusal.go (the stored 422);
//   - recovery_point.go: the unit's writes committed with the recovery
//     point, over savepoint.go, phase_tx.go, phase_tx_control.go and
//     assume_prepare.go;
//   - release.go: the key let go when the attempt did not finish it.
//
// Beside the path: runner.go (the Runner and its registry), config.go,
// workflow.go, input.go (the input decoded, Invalid), observer.go,
// fault.go, classify.go (what a store or phase error means), errors.go and
// header.go, which any step may call; phase.go (what users declare),
// resume.go
// (Resume), inspect.go (Inspect), history.go (KeyHistory), key_state.go (a
// key's states and their transitions), operator.go (ListKeys, Unpark,
// Forget, RecordResolution), parked.go (ForgetKeys, UnparkKeys,
// ReapParked), console.go (KeyLevels, ListKeyPage and the rest an
// operator's console reads; the apui package serves one), audit.go (the
// operators' audit trail), downstream_lookup.go (FindDownstreamKey),
// sweep.go (the Sweeper and Reap), migrate.go, migrate_online.go,
// exec_mode_check.go and citus.go. The "code, file by file" section of docs/concepts.md walks it
// in more detail, and a test holds the code to its order.
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
