package main

import (
	"context"
	"os"
	"testing"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// TestQuickstart runs the example end to end; run returns an error if any
// of its invariants (2 charges, 2 orders, byte-identical replay) fails.
func TestQuickstart(t *testing.T) {
	db := atomicphasetest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
