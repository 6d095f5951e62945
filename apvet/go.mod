module github.com/atomicphase/atomicphase/apvet

go 1.25.0

replace github.com/atomicphase/atomicphase => ../

require (
	github.com/atomicphase/atomicphase v0.3.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/tools v0.49.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.39.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
