package broken

import (
	"context"
	"sync"

	"github.com/atomicphase/atomicphase"
	"golang.org/x/sync/errgroup"
)

// Goroutines started by sync.WaitGroup.Go and errgroup.Group.Go are
// goroutines too.
var goroutinePhases = []atomicphase.Phase[Ride]{
	atomicphase.Local("waitgroup", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
		var wg sync.WaitGroup
		wg.Go(func() { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
			_, _ = tx.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`)
		})
		wg.Wait()
		return atomicphase.Continue(), nil
	}),
	atomicphase.Local("errgroup", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
		g, gctx := errgroup.WithContext(ctx)
		for range 2 {
			g.Go(func() error { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
				_, err := tx.Exec(gctx, `INSERT INTO rides DEFAULT VALUES`)
				return err
			})
		}
		return atomicphase.Continue(), g.Wait()
	}),
	// Reported once, naming tx (not the err the statement returned).
	atomicphase.Local("goroutine with a result", func(ctx context.Context, tx atomicphase.Tx, r *Ride) (atomicphase.Outcome, error) {
		errc := make(chan error, 1)
		go func() { // want `a goroutine in a phase uses the phase's transaction \(tx\)`
			_, err := tx.Exec(ctx, `INSERT INTO rides DEFAULT VALUES`)
			errc <- err
		}()
		return atomicphase.Continue(), <-errc
	}),
}
