package faultinject_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestServerLinksNoTestMachinery lists what faultinject, and a small server
// built on atomicphase, aphttp and faultinject (testdata/server), link:
// neither testing, nor a Docker client, nor atomicphasetest may be among it.
// A server enables fault injection through FromEnv, so whatever faultinject
// imports ends up in production binaries.
func TestServerLinksNoTestMachinery(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command:", err)
	}
	for _, pkg := range []string{".", "./testdata/server"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if isTestMachinery(dep) {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

func isTestMachinery(pkg string) bool {
	return pkg == "testing" || strings.HasPrefix(pkg, "testing/") ||
		strings.Contains(pkg, "dockertest") || strings.Contains(pkg, "docker/") ||
		strings.Contains(pkg, "stretchr/testify") || strings.Contains(pkg, "atomicphasetest")
}
