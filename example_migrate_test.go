package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// ExampleMigrate puts the key store in a schema of its own and checks at
// start-up that a Runner finds it there.
func ExampleMigrate() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, &atomicphasetest.Options{SkipMigrations: true}) // an empty database
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	applied, err := atomicphase.Migrate(ctx, db.Pool, &atomicphase.MigrateOpts{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", applied)

	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.CheckSchema(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("billing: schema ready")

	// A Runner left on the default schema would not find it.
	elsewhere, err := atomicphase.NewRunner(db.Pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = elsewhere.CheckSchema(ctx)
	fmt.Println("search_path: schema missing:", errors.Is(err, atomicphase.ErrSchemaMissing))
	// Output:
	// applied: [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20]
	// billing: schema ready
	// search_path: schema missing: true
}
