package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// TestQuickstart runs the example end to end (run returns an error if any
// of its invariants, 2 charges, 2 orders and a byte-identical replay,
// fails) and holds the docs to what it printed: the README quotes its
// output, and the README and docs/concepts.md give its round trips, which
// are measured here, not copied by hand.
func TestQuickstart(t *testing.T) {
	db := atomicphasetest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	var out bytes.Buffer
	if err := run(context.Background(), io.MultiWriter(os.Stdout, &out)); err != nil {
		t.Fatal(err)
	}

	if atomicphasetest.OnCitus() {
		// The docs quote one PostgreSQL's output: on Citus every request
		// reads its key first, one round trip more (docs/scale.md).
		t.Log("on Citus: the run's invariants hold; its output is not the one the docs quote")
		return
	}
	readme := read(t, "README.md")
	quoted := regexp.MustCompile("(?s)```\n(atomicphase quickstart: .*?)```").FindStringSubmatch(readme)
	if quoted == nil {
		t.Fatal("README.md quotes the quickstart's output in a code block beginning \"atomicphase quickstart:\"")
	}
	if quoted[1] != out.String() {
		t.Errorf("README.md quotes the quickstart's output as\n%s\nbut it prints\n%s", quoted[1], out.String())
	}

	first := number(t, out.String(), `order-a .*\(3 phases, (\d+) round trips\)`, "the quickstart's output")
	warm := warmRoundTrips(t)
	for _, doc := range []struct {
		file, pattern string
	}{
		{"README.md", `the quickstart's first phase reads back its order id: (\d+) on a warm connection; its first request prints (\d+)`},
		{filepath.Join("docs", "concepts.md"), `The quickstart, whose first phase reads back what it inserts: \*\*(\d+)\*\* \(its first request, which also does a process's one-time work, prints (\d+)\)`},
	} {
		// Any run of spaces and line breaks between the words: the text is
		// reflowed freely.
		m := regexp.MustCompile(strings.ReplaceAll(doc.pattern, " ", `\s+`)).FindStringSubmatch(read(t, doc.file))
		if m == nil {
			t.Errorf("%s gives the quickstart's round trips as /%s/", doc.file, doc.pattern)
			continue
		}
		if got, _ := strconv.Atoi(m[1]); int64(got) != warm {
			t.Errorf("%s: %q, but a warm request of the quickstart measures %d round trips", doc.file, m[0], warm)
		}
		if got, _ := strconv.Atoi(m[2]); int64(got) != first {
			t.Errorf("%s: %q, but the quickstart's first request prints %d", doc.file, m[0], first)
		}
	}
}

// warmRoundTrips measures a request of the quickstart's workflow on a
// warm connection: a new key, after one request warmed the runner and the
// connection up (the versions recorded, the statements prepared).
func warmRoundTrips(t *testing.T) int64 {
	t.Helper()
	trips := &atomicphasetest.RoundTrips{}
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{PoolConfig: func(c *pgxpool.Config) {
		c.MaxConns = 1 // one connection, so statements stay prepared
		c.ConnConfig.Tracer = trips
	}})
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, ordersTable); err != nil {
		t.Fatal(err)
	}
	payments, err := fakestripe.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer payments.Close()
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	wf := newOrderWorkflow(payments.URL)
	for _, key := range []string{"warm-up", "measured"} {
		trips.Reset()
		if _, err := runner.Run(ctx, wf, atomicphase.Request{Scope: "customer_42", Key: key, Method: "POST", Path: "/orders",
			Params: []byte(`{"item": "rocket boots", "amount": 2000}`)}); err != nil {
			t.Fatal(err)
		}
	}
	return trips.Count()
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func number(t *testing.T, text, pattern, where string) int64 {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s has no /%s/:\n%s", where, pattern, strings.TrimSpace(text))
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}
