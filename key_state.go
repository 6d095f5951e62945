package atomicphase

// The key's life, as one table: which operation may move a key from which
// status (KeyStatus, or absent) to which. Every operation's SQL judges the
// key by its own predicate today; this table is the one definition they
// are held to, by a model-based test (TestKeyStatesFollowTheTable) that
// drives random operations, crashes and lost answers against a real
// database and checks every step's before and after against it.

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
	// opTime: time passes (leases, backoffs and call marks run out).
	opTime keyOp = "time"
)

// keyAbsent stands for a key with no row: never recorded, or deleted.
const keyAbsent KeyStatus = "absent"

// keyTransitions says, for each operation, to which statuses it may move a
// key in each status. A status missing from an operation's map may not
// change under it.
var keyTransitions = map[keyOp]map[KeyStatus][]KeyStatus{
	// A run records a key or takes one nobody holds, and leaves it
	// finished, failed (abandoned, waiting on an unknown outcome, parked)
	// or, when its process dies, held by nobody alive (in progress until
	// its lease runs out). A held key is refused and stays as it is; a
	// finished one is replayed.
	opRun: {
		keyAbsent:    {keyAbsent, KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyStale:     {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyAbandoned: {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyUnknown:   {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		// A key parked after its attempts ran out is resumed by a retry;
		// one parked for good is refused and stays parked.
		KeyParked: {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
	},
	opResume: {
		KeyStale:     {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyAbandoned: {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyUnknown:   {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyParked:    {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
	},
	// The sweep takes what is due, never a parked key.
	opSweep: {
		KeyStale:     {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyAbandoned: {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
		KeyUnknown:   {KeyFinished, KeyAbandoned, KeyUnknown, KeyParked, KeyInProgress},
	},
	opUnpark: {KeyParked: {KeyAbandoned, KeyUnknown}},
	// A verdict settles an unknown outcome (of a parked key too).
	opVerdict:    {KeyUnknown: {KeyAbandoned, KeyUnknown}, KeyParked: {KeyAbandoned, KeyUnknown}},
	opForget:     {KeyFinished: {keyAbsent}, KeyParked: {keyAbsent}},
	opReapParked: {KeyParked: {keyAbsent}},
	opReap:       {KeyFinished: {keyAbsent}},
	// Leases and call marks run out: a held key goes stale, or, held only
	// by a call's quiet period, abandoned or unknown.
	opTime: {KeyInProgress: {KeyStale, KeyAbandoned, KeyUnknown}},
}

// keyTransitionAllowed reports whether op may move a key from status from
// to status to. Staying where it was is always allowed.
func keyTransitionAllowed(op keyOp, from, to KeyStatus) bool {
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

// keyDeletable are the statuses whose key an operation that deletes may
// delete, provided the key is settled (KeyInfo.Unsettled false): a
// finished key, or a parked one. Never a key that may have paid.
func keyDeletable(from KeyStatus, unsettled bool) bool {
	return from == KeyFinished || (from == KeyParked && !unsettled)
}
