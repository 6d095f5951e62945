package atomicphasetest_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

type greeting struct {
	Name string `json:"name"`
	ID   int64  `json:"id,omitempty"`
}

// A test gets its database from NewDB(t, opts), dropped when the test
// ends; code without a testing.TB, like this example, uses Open and Close.
// The database is migrated and holds what Options.Setup created: a clone
// of a template built once per process.
func ExampleOpen() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, &atomicphasetest.Options{
		SetupID: "example-greetings-v1",
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `CREATE TABLE greetings (id bigserial PRIMARY KEY, name text NOT NULL)`)
			return err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	start := func(in struct {
		Name string `json:"name"`
	}, _ *atomicphase.Request) (greeting, error) {
		return greeting{Name: in.Name}, nil
	}
	greet := atomicphase.MustWorkflow("greet", start, []atomicphase.Phase[greeting]{
		atomicphase.Local("insert", func(ctx context.Context, tx atomicphase.Tx, g *greeting) (atomicphase.Outcome, error) {
			if err := tx.QueryRow(ctx, `INSERT INTO greetings (name) VALUES ($1) RETURNING id`, g.Name).Scan(&g.ID); err != nil {
				return atomicphase.Outcome{}, err
			}
			body, err := json.Marshal(g)
			return atomicphase.Respond(201, body), err
		}),
	}, nil)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	req := atomicphase.Request{Scope: "user_1", Key: "greet-1", Method: "POST", Path: "/greetings", Params: []byte(`{"name": "Ada"}`)}
	for range 2 {
		resp, err := runner.Run(ctx, greet, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Replayed)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM greetings`).Scan(&rows); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rows:", rows)
	// Output:
	// 201 {"name":"Ada","id":1} replayed: false
	// 201 {"name":"Ada","id":1} replayed: true
	// rows: 1
}
