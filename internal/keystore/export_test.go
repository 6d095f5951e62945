package keystore

// PeekSQL is the replay's read, for the plan test.
const PeekSQL = peekSQL
