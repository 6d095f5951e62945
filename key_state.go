package atomicphase

// The key's life, as one table: which operation may move a key from which
// stored state (keyState, or absent) to which. A key's state is stored, as
// one column (status, migration 017), and every statement that writes a
// key sets it and names, in its WHERE, the states its operation may move a
// key from, as this table says (the SQL marks each such test with a
// comment, "from: <op>", which TestKeyStateTableIsTheDatabases holds to
// the table). A model-based test (TestKeyStatesFollowTheTable) drives
// random operations, crashes, broken connections, lost answers and
// concurrent takes against a real database and checks every step's before
// and after against it. The database holds every DELETE to the table too
// (a trigger, which a request that succeeds first time never fires).

// keyOp is an operation on a key, as the table names it.
type keyOp string

// The operations.
const (
	// opRun: a client's request (acquisition or take, phases, checkpoints,
	// then a finish, a failure or a park), or a replay, or a refusal.
	opRun keyOp = "run"
	// opResume: Runner.Resume, a take with no request at hand.
	opResume keyOp = "resume"
	// opSweep: one sweep's pick, and the takes and runs that follow (its
	// reaps are opReap and opReapParked).
	opSweep keyOp = "sweep"
	// opUnpark: Runner.Unpark.
	opUnpark keyOp = "unpark"
	// opVerdict: Runner.RecordResolution.
	opVerdict keyOp = "verdict"
	// opForget: Runner.Forget (never forced).
	opForget keyOp = "forget"
	// opReapParked: Runner.ReapParked.
	opReapParked keyOp = "reap-parked"
	// opReap: Runner.Reap (finished keys).
	opReap keyOp = "reap"
	// opDue: Runner.MakeDue, which clears a backoff and moves no key.
	opDue keyOp = "due"
	// opTime: time passes (leases, backoffs and call marks run out).
	opTime keyOp = "time"
)

// keyState is a key's stored state: the status column (migration 017),
// by its name (the column holds its first letter). Time changes no state:
// a running key whose lease ran out is stale, and a waiting key in a
// call's quiet period is in progress, only as a reader sees them
// (KeyStatus).
type keyState string

// The states, and keyAbsent for a key with no row (never recorded, or
// deleted).
const (
	// stateRunning: an attempt holds the key (its lease running, or run
	// out: stale).
	stateRunning keyState = "running"
	// stateWaiting: nobody holds the key; it is to be resumed, by a retry
	// or the sweep (abandoned, or in a call's quiet period).
	stateWaiting keyState = "waiting"
	// stateUnknown: nobody holds the key, and a foreign call's outcome is
	// unknown.
	stateUnknown  keyState = "unknown"
	stateParked   keyState = "parked"
	stateFinished keyState = "finished"
	keyAbsent     keyState = "absent"
)

// keyStates are the states a row may be in.
var keyStates = []keyState{stateRunning, stateWaiting, stateUnknown, stateParked, stateFinished}

// keyStatusesIn are the statuses a reader may see a key in each state in.
var keyStatusesIn = map[keyState][]KeyStatus{
	stateRunning:  {KeyInProgress, KeyStale},
	stateWaiting:  {KeyInProgress, KeyAbandoned},
	stateUnknown:  {KeyUnknown},
	stateParked:   {KeyParked},
	stateFinished: {KeyFinished},
}

// taken are the states an attempt that takes a key may leave it in.
var taken = []keyState{stateRunning, stateWaiting, stateUnknown, stateParked, stateFinished}

// keyTransitions says, for each operation, to which states it may move a
// key in each state. A state missing from an operation's map may not
// change under it; time (opTime) changes none.
var keyTransitions = map[keyOp]map[keyState][]keyState{
	// A run records a key (or records nothing: a refusal) or takes one
	// nobody holds, or whose lease ran out, and leaves it finished, waiting,
	// unknown or parked, or, when its process dies, running until its lease
	// runs out. A held key is refused and stays as it is; a finished one is
	// replayed. A key parked after its attempts ran out is resumed by a
	// retry; one parked for good is refused and stays parked.
	opRun: {
		keyAbsent:    append([]keyState{keyAbsent}, taken...),
		stateRunning: taken,
		stateWaiting: taken,
		stateUnknown: taken,
		stateParked:  taken,
	},
	opResume: {stateRunning: taken, stateWaiting: taken, stateUnknown: taken, stateParked: taken},
	// The sweep takes what is due, never a parked key.
	opSweep:  {stateRunning: taken, stateWaiting: taken, stateUnknown: taken},
	opUnpark: {stateParked: {stateWaiting, stateUnknown}},
	// A verdict settles an unknown outcome, of a parked key too; it makes
	// due (waiting) a key parked because its attempts ran out, and leaves
	// one parked for good (a permanent failure, a panic: a bug an operator
	// fixes, then unparks) parked. A running key takes it only once its
	// holder's lease ran out, and stays running: the attempt that holds it
	// next takes the verdict.
	opVerdict: {stateRunning: {stateRunning}, stateUnknown: {stateWaiting, stateUnknown},
		stateParked: {stateWaiting, stateUnknown}},
	opForget:     {stateFinished: {keyAbsent}, stateParked: {keyAbsent}},
	opReapParked: {stateParked: {keyAbsent}},
	opReap:       {stateFinished: {keyAbsent}},
	opDue:        {stateRunning: {stateRunning}, stateWaiting: {stateWaiting}, stateUnknown: {stateUnknown}},
	opTime:       {},
}

// keyStateChanges are the changes one write may make to a row's state:
// every pair some operation allows, the deletes apart.
func keyStateChanges() map[[2]keyState]bool {
	out := map[[2]keyState]bool{}
	for _, byFrom := range keyTransitions {
		for from, tos := range byFrom {
			for _, to := range tos {
				if from != to && from != keyAbsent && to != keyAbsent {
					out[[2]keyState{from, to}] = true
				}
			}
		}
	}
	return out
}

// keyTransitionAllowed reports whether op may move a key from status from
// to status to. Staying where it was is always allowed.
func keyTransitionAllowed(op keyOp, from, to keyState) bool {
	if from == to {
		return true
	}
	for _, s := range keyTransitions[op][from] {
		if s == to {
			return true
		}
	}
	return false
}

// keyDeletable reports whether an operation that deletes may delete a key
// in state from without being forced: a finished key, or a parked one that
// is settled (KeyInfo.Unsettled false). Never a key that may have paid.
// The database holds every DELETE to it (atomicphase_deletable).
func keyDeletable(from keyState, unsettled bool) bool {
	return from == stateFinished || (from == stateParked && !unsettled)
}
