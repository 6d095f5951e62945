package pgtemp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
)

// ErrNoBinaries is wrapped by Start's error when no PostgreSQL server
// binaries were found.
var ErrNoBinaries = errors.New("no initdb and postgres on PATH or under /usr/lib/postgresql/*/bin")

// BinEnv names the environment variable that, when set, is the one
// directory Start takes initdb and postgres from: to test on another
// PostgreSQL version than the installed one (scripts/postgres-version
// unpacks one and prints its directory).
const BinEnv = "ATOMICPHASE_TEST_PG_BIN"

// FindBinaries returns the directory of the binaries Start would use (see
// findBinaries); the error wraps ErrNoBinaries when there are none.
func FindBinaries() (string, error) { return findBinaries() }

// findBinaries returns the directory holding initdb and postgres: BinEnv's
// if set (and nothing else), else the one initdb on PATH resolves to, else
// the newest /usr/lib/postgresql/*/bin (where Debian and Ubuntu put them,
// off PATH).
func findBinaries() (string, error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		if !hasBinaries(dir) {
			return "", fmt.Errorf("%w: %s=%s has no initdb and postgres", ErrNoBinaries, BinEnv, dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			dir = filepath.Dir(resolved)
		}
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}
