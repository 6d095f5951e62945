package upgradetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// service is one process of testdata/service, the same payout service
// built with the previous release or with this one.
type service struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// lines are what it printed per key: "STATUS BODYHASH replayed=BOOL".
	lines map[string]string
	// steps gets each step it reports ("migrated", "first", "served").
	steps chan string
	done  chan error
}

// start runs bin as a service named name paying out keys (first-last,
// down when first is the larger).
func start(t *testing.T, ctx context.Context, bin, name, dbURL, keys string) *service {
	t.Helper()
	s := &service{name: name, lines: map[string]string{}, steps: make(chan string, 3), done: make(chan error, 1)}
	s.cmd = exec.CommandContext(ctx, bin)
	s.cmd.Env = append(withoutEnv(os.Environ(), "TEST_DATABASE_URL", "DATABASE_URL"),
		"DATABASE_URL="+dbURL, "SERVICE_NAME="+name, "KEYS="+keys)
	var stderr strings.Builder
	s.cmd.Stderr = &stderr
	stdout, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	s.stdin, err = s.cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			key, rest, found := strings.Cut(lines.Text(), " ")
			if !found {
				s.steps <- key
				continue
			}
			s.lines[key] = rest
		}
		err := s.cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%s: %w: %s", name, err, stderr.String())
		}
		s.done <- err
	}()
	return s
}

// reach waits until s reports step, failing the test if it exits first.
func (s *service) reach(t *testing.T, step string) {
	t.Helper()
	select {
	case got := <-s.steps:
		require.Equal(t, step, got, s.name)
	case err := <-s.done:
		t.Fatalf("%s exited before %q: %v", s.name, step, err)
	}
}

// proceed lets s go on from the step it waits at.
func (s *service) proceed(t *testing.T) {
	t.Helper()
	_, err := io.WriteString(s.stdin, "go\n")
	require.NoError(t, err)
}

// run takes the services through their steps together: each migrates at
// start-up, each pays its first key, then each serves the rest.
func run(t *testing.T, services ...*service) {
	t.Helper()
	for _, step := range []string{"migrated", "first"} {
		for _, s := range services {
			s.reach(t, step)
		}
		for _, s := range services {
			s.proceed(t)
		}
	}
	for _, s := range services {
		s.reach(t, "served")
	}
}

// stop closes s's stdin and waits for it to exit cleanly.
func (s *service) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, s.stdin.Close())
	require.NoError(t, <-s.done)
}

// The previous release and this one, side by side, each calling Migrate
// with no options at start-up, as a service does: a process of the
// previous release serves on its own schema; this release starts while it
// serves (its Migrate applies the expand steps) and another process of
// the previous release starts with it (its Migrate applies nothing), the
// two paying out the same keys; a contract step this release has is
// refused while a process of the previous release lives, and applied once
// none does; a process of this release then replays every key and pays
// out new ones. The bank pays each key once, each key's answer is the
// same byte for byte from every process, and every key finishes.
func TestPreviousReleaseAndThisOneSideBySide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := startPrevious(t, ctx, "to run the previous release beside this one")
	admin, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE sidebyside")
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	u.Path = "/sidebyside"
	dbURL := u.String()

	// The service built with each release.
	dir := t.TempDir()
	prevTree := filepath.Join(dir, "previous")
	require.NoError(t, os.MkdirAll(filepath.Join(prevTree, "cmd", "sidebyside"), 0o755))
	extractPrevious(t, ctx, prevTree)
	src, err := os.ReadFile(filepath.Join("testdata", "service", "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(prevTree, "cmd", "sidebyside", "main.go"), src, 0o644))
	previousBin, thisBin := filepath.Join(dir, "previous-service"), filepath.Join(dir, "this-service")
	build := exec.CommandContext(ctx, "go", "build", "-o", previousBin, "./cmd/sidebyside")
	build.Dir = prevTree
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the service with the previous release: %s", out)
	out, err = exec.CommandContext(ctx, "go", "build", "-o", thisBin, "./testdata/service").CombinedOutput()
	require.NoError(t, err, "build the service with this release: %s", out)

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	states := func(when string) {
		rows, err := pool.Query(ctx, `SELECT coalesce(response_status::text, 'unfinished'), count(*) FROM idempotency_keys GROUP BY 1 ORDER BY 1`)
		require.NoError(t, err)
		var got []string
		var status string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
			got = append(got, fmt.Sprintf("%s: %d", status, n))
			return nil
		})
		require.NoError(t, err)
		t.Logf("keys by response status %s: %s", when, strings.Join(got, ", "))
	}

	a := start(t, ctx, previousBin, "previous-a", dbURL, "1-20")
	run(t, a)
	states("with the previous release alone")

	b := start(t, ctx, thisBin, "this-b", dbURL, "40-1")
	c := start(t, ctx, previousBin, "previous-c", dbURL, "21-40")
	run(t, b, c) // both pay a key before either goes on: side by side
	states("with both releases serving")
	pending, err := atomicphase.PendingMigrations(ctx, pool, nil)
	require.NoError(t, err)
	for _, m := range pending {
		require.True(t, m.Contract, "the start-ups applied every expand step: %03d_%s is left", m.Version, m.Name)
	}
	if len(pending) == 0 {
		// This release contracts nothing the previous one reads.
		a.stop(t)
		c.stop(t)
	} else {
		_, err = atomicphase.Migrate(ctx, pool, &atomicphase.MigrateOpts{Contract: true})
		require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive)
		a.stop(t)
		c.stop(t)
		_, err = atomicphase.Migrate(ctx, pool, &atomicphase.MigrateOpts{Contract: true})
		require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive, "the previous release was seen within the default window")
		applied, err := atomicphase.Migrate(ctx, pool, &atomicphase.MigrateOpts{Contract: true, LiveWithin: time.Millisecond})
		require.NoError(t, err, "no process of the previous release was seen in the last millisecond")
		want := make([]int, len(pending))
		for i, m := range pending {
			want[i] = m.Version
		}
		require.Equal(t, want, applied)
	}

	d := start(t, ctx, thisBin, "this-d", dbURL, "1-50")
	run(t, d)
	b.stop(t)
	d.stop(t)
	states("after the contract step")

	var keys, finished, paid, recorded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE response_status = 201) FROM idempotency_keys`).Scan(&keys, &finished))
	require.Equal(t, 50, keys)
	require.Equal(t, 50, finished)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT key), count(*) FROM bank_payments`).Scan(&paid, &recorded))
	require.Equal(t, 50, paid)
	require.Equal(t, 50, recorded, "the bank paid each key once")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT key), count(*) FROM payouts`).Scan(&paid, &recorded))
	require.Equal(t, [2]int{50, 50}, [2]int{paid, recorded}, "each payout recorded once")
	var byRelease []string
	rows, err := pool.Query(ctx, `SELECT by || ': ' || count(*) FROM bank_payments GROUP BY by ORDER BY by`)
	require.NoError(t, err)
	byRelease, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	t.Logf("payments made by each process: %s", strings.Join(byRelease, ", "))
	require.Len(t, byRelease, 4, "each process paid out keys of its own: %v", byRelease)

	for i := 1; i <= 50; i++ {
		key := fmt.Sprintf("payout-%03d", i)
		want := d.lines[key]
		require.NotEmpty(t, want, key)
		body, _, _ := strings.Cut(want, " replayed=")
		for _, s := range []*service{a, b, c} {
			if got, ok := s.lines[key]; ok {
				gotBody, _, _ := strings.Cut(got, " replayed=")
				require.Equal(t, body, gotBody, "%s's answer from %s and from this-d", key, s.name)
			}
		}
		require.Equal(t, i <= 40, strings.HasSuffix(want, "replayed=true"), "%s from this-d", key)
	}
}
