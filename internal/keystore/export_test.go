package keystore

// PeekSQL is the replay's read, for the plan test.
const PeekSQL = peekSQL

// AbandonedSQL and ReapSQL are the sweep's reads of the key table, for the
// plan tests.
const (
	AbandonedSQL = abandonedSQL
	UnknownSQL   = unknownSQL
	ReapSQL      = reapSQL
)
