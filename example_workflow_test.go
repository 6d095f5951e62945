package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

type transfer struct {
	Amount     int    `json:"amount"`
	TransferID int64  `json:"transfer_id,omitempty"`
	BankRef    string `json:"bank_ref,omitempty"`
}

// Example shows a workflow of three phases, a replay, and a retry after a
// transient failure that resumes where the first attempt stopped.
func Example() {
	ctx := context.Background()
	db, err := atomicphasetest.Open(ctx, nil) // a migrated database of its own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_transfers (id bigserial PRIMARY KEY, amount int, bank_ref text)`); err != nil {
		log.Fatal(err)
	}

	bankDown := true
	wf := atomicphase.MustWorkflow("transfer", startEmpty[transfer], []atomicphase.Phase[transfer]{
		atomicphase.Local("record", func(ctx context.Context, tx atomicphase.Tx, t *transfer) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), tx.QueryRow(ctx,
				`INSERT INTO example_transfers (amount) VALUES ($1) RETURNING id`, t.Amount).Scan(&t.TransferID)
		}),
		atomicphase.Foreign("send", func(ctx context.Context, call *atomicphase.ForeignCall, t *transfer) error {
			return call.Do(ctx, func(ctx context.Context, key string) error {
				if bankDown {
					return errors.New("bank unreachable")
				}
				t.BankRef = "ref-" + key[:6] // a real bank would deduplicate by key
				return nil
			})
		}, nil),
		atomicphase.Local("confirm", func(ctx context.Context, tx atomicphase.Tx, t *transfer) (atomicphase.Outcome, error) {
			_, err := tx.Exec(ctx, `UPDATE example_transfers SET bank_ref = $1 WHERE id = $2`, t.BankRef, t.TransferID)
			return atomicphase.Respond(201, []byte(`{"status":"sent"}`)), err
		}),
	}, nil)

	runner, err := atomicphase.NewRunner(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	req := atomicphase.Request{Scope: "acct_1", Key: "transfer-2026-11-22", Method: "POST", Path: "/transfers",
		Params: []byte(`{"amount": 500}`)}

	_, err = runner.Run(ctx, wf, req)
	var pe *atomicphase.PhaseError
	if errors.As(err, &pe) {
		fmt.Printf("first attempt failed in phase %q: %v\n", pe.Phase, pe.Err)
	}

	bankDown = false
	resp, err := runner.Run(ctx, wf, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry:", resp.Status, string(resp.Body), "replayed:", resp.Replayed)

	resp, err = runner.Run(ctx, wf, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("again:", resp.Status, string(resp.Body), "replayed:", resp.Replayed)

	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM example_transfers`).Scan(&rows)
	fmt.Println("transfers recorded:", rows)
	// Output:
	// first attempt failed in phase "send": bank unreachable
	// retry: 201 {"status":"sent"} replayed: false
	// again: 201 {"status":"sent"} replayed: true
	// transfers recorded: 1
}
