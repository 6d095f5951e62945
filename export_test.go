package atomicphase

// ApplyMigration lets the external tests apply a migration of their own
// making, as Migrate applies the package's.
var ApplyMigration = applyMigration
