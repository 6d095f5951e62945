package atomicphase

// SplitStatements lets the external tests run a migration's SQL one
// statement at a time, as Migrate does.
var SplitStatements = splitStatements
