package faultinject_test

import (
	"os"
	"testing"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	os.Exit(atomicphasetest.Main(m))
}

// shopDB is a database with the test shop's orders table.
var shopDB = &atomicphasetest.Options{SetupID: testshop.SetupID, Setup: testshop.Setup}

// newPayments starts the fake payment API for one test.
func newPayments(t testing.TB) *fakestripe.Server {
	t.Helper()
	p, err := fakestripe.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
