module github.com/atomicphase/atomicphase/apvet

go 1.25.0

replace github.com/atomicphase/atomicphase => ../

require (
	github.com/atomicphase/atomicphase v0.2.0
	golang.org/x/tools v0.49.0
)

require (
	golang.org/x/mod v0.39.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
