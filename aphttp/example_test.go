package aphttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// ExampleMiddleware serves a one-phase workflow over HTTP: a first request
// runs it, a retry with the same key replays the stored answer marked
// Idempotent-Replayed: true, and the same key with another body is a 422.
func ExampleMiddleware() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, nil) // a migrated database of its own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE notes (id bigserial PRIMARY KEY, text text NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	// What the client sends, and what the workflow keeps between phases.
	type noteInput struct {
		Text string `json:"text"`
	}
	type note struct {
		ID   int64  `json:"id"`
		Text string `json:"text"`
	}
	start := func(in noteInput, _ *atomicphase.Request) (note, error) {
		if in.Text == "" {
			return note{}, errors.New("text is required")
		}
		return note{Text: in.Text}, nil
	}
	createNote := atomicphase.MustWorkflow("create_note", start, []atomicphase.Phase[note]{
		atomicphase.Local("insert", func(ctx context.Context, tx atomicphase.Tx, n *note) (atomicphase.Outcome, error) {
			if err := tx.QueryRow(ctx, `INSERT INTO notes (text) VALUES ($1) RETURNING id`, n.Text).Scan(&n.ID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body, err := json.Marshal(n)
			return atomicphase.Respond(http.StatusCreated, body), err
		}),
	}, nil)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	mw := aphttp.Middleware(runner, createNote, &aphttp.Options{
		Scope: func(r *http.Request) (string, error) {
			if user := r.Header.Get("X-User"); user != "" {
				return user, nil
			}
			return "", fmt.Errorf("%w: send X-User", aphttp.ErrUnauthorized)
		},
	})
	srv := httptest.NewServer(mw(http.NotFoundHandler()))
	defer srv.Close()

	post := func(key, body string) {
		req, err := http.NewRequest("POST", srv.URL+"/notes", strings.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("X-User", "alice")
		req.Header.Set(aphttp.HeaderName, aphttp.FormatKey(key))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s → %d", body, resp.StatusCode)
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			fmt.Print(" Idempotent-Replayed: true")
		}
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var p aphttp.Problem
			if err := json.Unmarshal(data, &p); err != nil {
				log.Fatal(err)
			}
			fmt.Println(" problem", strings.TrimPrefix(p.Type, aphttp.ProblemTypeBase))
			return
		}
		fmt.Println("", string(data))
	}

	post("note-1", `{"text":"hello"}`)
	post("note-1", `{"text":"hello"}`) // a retry: the stored answer, no phase runs
	post("note-1", `{"text":"bye"}`)   // the same key for another request

	var notes int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM notes`).Scan(&notes); err != nil {
		log.Fatal(err)
	}
	fmt.Println("notes in the database:", notes)
	// Output:
	// {"text":"hello"} → 201 {"id":1,"text":"hello"}
	// {"text":"hello"} → 201 Idempotent-Replayed: true {"id":1,"text":"hello"}
	// {"text":"bye"} → 422 problem key-reused
	// notes in the database: 1
}

// ExampleParseKey shows the two forms of a key the header accepts, the
// IETF draft's sf-string and Stripe's bare token, naming the same key, and
// a list, which is not one key.
func ExampleParseKey() {
	for _, value := range []string{`"8e03978e-40d5"`, `8e03978e-40d5`, `"a", "b"`} {
		h := http.Header{}
		h.Set(aphttp.HeaderName, value)
		key, err := aphttp.ParseKey(h)
		switch {
		case errors.Is(err, aphttp.ErrInvalidKey):
			fmt.Printf("%-16s → rejected: %v\n", value, err)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("%-16s → key %s\n", value, key)
		}
	}
	// Output:
	// "8e03978e-40d5"  → key 8e03978e-40d5
	// 8e03978e-40d5    → key 8e03978e-40d5
	// "a", "b"         → rejected: malformed Idempotency-Key header: unexpected ", \"b\"" after the quoted key (a list or parameters?)
}
