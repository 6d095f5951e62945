// Command service is a payout service built on atomicphase, the same
// source against each release: the side-by-side upgrade test builds it
// with the previous release and with this one. At start-up it migrates the
// way a service does (Migrate with no options), records its workflow
// versions, says "migrated" and waits for a line on stdin, and pays out
// the keys named by KEYS ("first-last", in that
// order, down when first is the larger), retrying
// each while another process holds it; it prints one line per key (after
// the first, "first", and waits for another line), then "served", and
// stays live (its versions recorded) until its stdin closes.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

type payout struct {
	Key    string `json:"key"`
	Ref    int64  `json:"ref"`
	BankID int64  `json:"bank_id"`
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	name := os.Getenv("SERVICE_NAME")
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := atomicphase.Migrate(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate at start-up: %w", err)
	}
	in := bufio.NewScanner(os.Stdin)
	// wait says where it is and waits for a line on stdin: the test
	// starts two processes' work together, and holds each after its first
	// key until the other has paid one too.
	wait := func(what string) {
		fmt.Println(what)
		in.Scan()
	}
	// The service's own tables (bank_payments is the bank's side: one row
	// per payment it made).
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS payouts (ref bigserial PRIMARY KEY, key text NOT NULL, by text NOT NULL);
		CREATE TABLE IF NOT EXISTS bank_payments (id bigserial PRIMARY KEY, key text NOT NULL, by text NOT NULL)`); err != nil {
		return err
	}
	runner, err := atomicphase.NewRunner(pool, &atomicphase.Config{LockTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	wf := atomicphase.MustWorkflow("payout", func(_ struct{}, req *atomicphase.Request) (payout, error) {
		return payout{Key: req.Key}, nil
	}, []atomicphase.Phase[payout]{
		atomicphase.Local("record", func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			err := tx.QueryRow(ctx, `INSERT INTO payouts (key, by) VALUES ($1, $2) RETURNING ref`, p.Key, name).Scan(&p.Ref)
			return atomicphase.Continue(), err
		}),
		atomicphase.Foreign("pay", func(ctx context.Context, _ *atomicphase.ForeignCall, p *payout) error {
			return pool.QueryRow(ctx, `INSERT INTO bank_payments (key, by) VALUES ($1, $2) RETURNING id`, p.Key, name).Scan(&p.BankID)
		}, func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Local("answer", func(ctx context.Context, tx atomicphase.Tx, p *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(fmt.Sprintf(`{"key":%q,"ref":%d,"bank_id":%d}`, p.Key, p.Ref, p.BankID))), nil
		}),
	}, nil)
	if err := runner.Register(wf); err != nil {
		return err
	}
	if err := runner.RecordVersions(ctx); err != nil {
		return err
	}
	wait("migrated")
	first, last, _ := strings.Cut(os.Getenv("KEYS"), "-")
	lo, err1 := strconv.Atoi(first)
	hi, err2 := strconv.Atoi(last)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("KEYS: %w", err)
	}
	step := 1
	if lo > hi {
		step = -1 // from the last key down: another process may take the same keys from the first up
	}
	for i := lo; i != hi+step; i += step {
		key := fmt.Sprintf("payout-%03d", i)
		req := atomicphase.Request{Scope: "merchant", Key: key, Method: "POST", Path: "/payouts", Params: []byte(`{}`)}
		for {
			resp, err := runner.Run(ctx, wf, req)
			if errors.Is(err, atomicphase.ErrInProgress) {
				time.Sleep(10 * time.Millisecond) // another process runs it: retry, as a client does
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			fmt.Printf("%s %d %x replayed=%t\n", key, resp.Status, sha256.Sum256(resp.Body), resp.Replayed)
			break
		}
		if i == lo {
			wait("first")
		}
	}
	fmt.Println("served")
	// Live until told to stop: a process that stays up records its
	// versions again now and then (a sweep would).
	for in.Scan() {
		if err := runner.RecordVersions(ctx); err != nil {
			return err
		}
	}
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}
