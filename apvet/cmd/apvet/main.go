// Command apvet checks atomicphase workflows statically: see package
// github.com/atomicphase/atomicphase/apvet for what it finds. Run it on its
// own (apvet ./...) or as go vet's tool:
//
//	go install github.com/atomicphase/atomicphase/apvet/cmd/apvet
//	go vet -vettool=$(go env GOPATH)/bin/apvet ./...
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/atomicphase/atomicphase/apvet"
)

func main() { singlechecker.Main(apvet.Analyzer) }
