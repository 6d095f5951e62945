module github.com/atomicphase/atomicphase/apvet

go 1.25.0

replace github.com/atomicphase/atomicphase => ../

require (
	github.com/atomicphase/atomicphase v0.0.0-00010101000000-000000000000
	golang.org/x/tools v0.49.0
)

require (
	golang.org/x/mod v0.39.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
