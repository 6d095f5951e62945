package keystore

// PeekSQL is the replay's read, for the plan test.
const PeekSQL = peekSQL

// AbandonedSQL, UnknownSQL and ReapSQL (the reap's pick) are the sweep's reads of the key table, for the
// plan tests.
const (
	AbandonedSQL = abandonedSQL
	UnknownSQL   = unknownSQL
	ReapSQL      = reapPickSQL
	PassedSQL    = passedSQL
)
