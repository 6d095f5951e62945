package atomicphase

import "context"

// ApplyMigration lets the external tests apply a migration of their own
// making, as Migrate applies the package's.
func ApplyMigration(ctx context.Context, db Beginner, schema string, m Migration) (bool, error) {
	applied, err := applyAll(ctx, db, &MigrateOpts{Schema: schema}, []Migration{m})
	return len(applied) == 1, err
}

// SplitStatements splits SQL into statements as Migrate does.
var SplitStatements = splitStatements

// KeyOp, KeyState and the rest expose the key's transition table
// (key_state.go) to the model-based test and the database's.
type (
	KeyOp    = keyOp
	KeyState = keyState
)

const KeyAbsent = keyAbsent

var (
	KeyStates            = keyStates
	KeyStatusesIn        = keyStatusesIn
	KeyStateChanges      = keyStateChanges
	KeyTransitions       = keyTransitions
	KeyTransitionAllowed = keyTransitionAllowed
	KeyDeletable         = keyDeletable
)

// ShapeOf is the hash of wf's phase list that the versions registry
// records.
func ShapeOf(wf AnyWorkflow) string { return wf.shape() }
