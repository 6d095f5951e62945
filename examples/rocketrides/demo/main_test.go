package main

import (
	"os"
	"testing"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		main() // the demo re-executes itself as the server
		return
	}
	os.Exit(atomicphasetest.Main(m))
}

// TestDemo runs the demo on a shorter stream (one server kill included);
// run returns an error if any invariant failed.
func TestDemo(t *testing.T) {
	db := atomicphasetest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	if err := run(14, 4, false); err != nil {
		t.Fatal(err)
	}
}
