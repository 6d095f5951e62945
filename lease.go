package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Leases. A held key's lock is a lease of Config.LockTimeout, stored on the
// key row (its length and when it was last renewed, so every reader, the
// CLI included, knows when it ends without configuration). Every statement
// that takes or renews it (acquisition, take, a phase commit) starts a new
// one; while an attempt works on something that may outlast it (a foreign
// call, a unit of phases), a lease renews it every third of its length,
// fenced by the lock token.
//
// The attempt keeps the local time at which it sent the last statement that
// renewed the lease (leaseFrom): the database started the lease no earlier,
// so leaseFrom + LockTimeout is a deadline the lease cannot end before, and
// the attempt treats it as the end. When a renewal finds that the token
// moved on (another attempt took the key), the lease cancels the context of
// the work it covers, with ErrLockLost as the cause, and the attempt
// commits nothing afterwards.
//
// A renewal that is merely late (the pool is busy, perhaps with the very
// unit the lease covers; the database is slow or out of reach) cancels
// nothing and loses nothing: it is tried again until it takes or the work
// ends, and what the work produced is committed all the same, fenced by
// the lock token, which refuses the commit only if another attempt did
// take the key meanwhile. The one exception is a marked call (a downstream
// without idempotency keys): its context never outlives the lease, so
// that once the lease plus Config.CallGrace has passed no call of this
// attempt can still be acted on when another attempt reconciles.
//
// A foreign call is also marked on the row (call_until) before it goes out:
// until the lease it runs under has ended plus Config.CallGrace, no other
// attempt may take the key, so none reconciles or calls while this call may
// still be in flight (docs/concepts.md, "Leases").

// errLeaseExpired is the cause of a lease that could not be renewed in
// time.
var errLeaseExpired = fmt.Errorf("%w: the lease could not be renewed before it ended", ErrLockLost)

// renewRetry is how soon a renewal that failed (not refused) is tried
// again, as a fraction of the lease.
const renewRetry = 10

// lease renews an attempt's hold on its key while it works.
type lease struct {
	a      *attempt
	ttl    time.Duration
	call   *time.Duration // the call mark renewals set, or nil
	cancel context.CancelCauseFunc
	// stop ends a renewal in flight when the lease ends (end), so that end
	// never waits for a renewal queued behind a busy pool.
	stopCtx context.Context
	stop    context.CancelFunc

	mu      sync.Mutex
	from    time.Time // local send time of the last renewal that took
	timer   *time.Timer
	stopped bool
	err     error
	ticks   sync.WaitGroup
}

// hold starts a lease over work that begins now, and returns the context
// the work runs under: cancelled, with ErrLockLost as its cause, when the
// lease is lost or runs out. With call set the work is a foreign call: the
// key is first marked as in a call, in one round trip, before anything goes
// out (ErrLockLost when the key is no longer this attempt's). Stop the
// lease with end before committing what the work produced.
func (a *attempt) hold(ctx context.Context, call bool) (*lease, context.Context, error) {
	l := &lease{a: a, ttl: a.r.cfg.LockTimeout, from: a.leaseFrom}
	ctx, l.cancel = context.WithCancelCause(ctx)
	l.stopCtx, l.stop = context.WithCancel(context.Background())
	if call {
		d := l.ttl + a.r.cfg.CallGrace
		l.call = &d
		sent := time.Now()
		ok, err := a.r.store.Renew(ctx, a.r.poolFor(a.scope), a.scope, a.key, a.token, l.call)
		switch {
		case err != nil:
			l.cancel(nil)
			l.stop()
			// The mark's fate is unknown (its answer may be what was
			// lost), and nothing was sent: end it by the token now, so
			// that it does not hold the key for the lease and the grace.
			a.callEnded(ctx, false)
			return nil, nil, storeError("mark a foreign call", err)
		case !ok:
			l.cancel(nil)
			l.stop()
			return nil, nil, ErrLockLost
		}
		l.from = sent
		a.leaseFrom = sent
	}
	l.mu.Lock()
	l.schedule(time.Now())
	l.mu.Unlock()
	return l, ctx, nil
}

// schedule arms the next renewal: a third of the lease after the last one
// that took, or at once when that is past; never later than the deadline.
// Called with mu held.
func (l *lease) schedule(now time.Time) {
	next := l.from.Add(l.ttl / 3).Sub(now)
	if next < 0 {
		next = 0
	}
	l.timer = time.AfterFunc(next, l.tick)
}

// tick renews the lease. A marked call's lease ends, cancelling the call,
// when its deadline has passed without a renewal; any other lease keeps
// trying.
func (l *lease) tick() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.ticks.Add(1) // under mu: before end's Wait, or not at all
	defer l.ticks.Done()
	deadline := l.from.Add(l.ttl)
	l.mu.Unlock()
	var ctx context.Context
	var cancel context.CancelFunc
	if l.call != nil {
		if !time.Now().Before(deadline) {
			l.lose(errLeaseExpired)
			return
		}
		ctx, cancel = context.WithDeadline(l.stopCtx, deadline)
	} else {
		ctx, cancel = context.WithTimeout(l.stopCtx, l.ttl/3)
	}
	sent := time.Now()
	ok, err := l.a.r.store.Renew(ctx, l.a.r.poolFor(l.a.scope), l.a.scope, l.a.key, l.a.token, l.call)
	cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	switch {
	case err == nil && !ok:
		l.loseLocked(ErrLockLost)
		return
	case err == nil:
		l.from = sent
		l.schedule(time.Now())
	case l.call != nil:
		// Out of reach: try again soon, until the deadline.
		retry := min(l.ttl/renewRetry, time.Until(deadline))
		l.timer = time.AfterFunc(max(retry, 0), l.tick)
	default:
		// Late or out of reach: try again soon. The work goes on; its
		// commit is fenced by the token.
		l.timer = time.AfterFunc(l.ttl/renewRetry, l.tick)
	}
}

func (l *lease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.loseLocked(err)
	}
}

func (l *lease) loseLocked(err error) {
	if l.err == nil {
		l.err = err
		l.cancel(err)
	}
}

// end stops renewing (a renewal in flight is abandoned, not waited for)
// and returns ErrLockLost (wrapped) when a renewal found the key taken by
// another attempt, or a marked call's lease ran out and cancelled it: what
// the work produced must then not be committed. A lease that merely went
// unrenewed returns nil: the commit that follows is fenced by the token.
// The attempt's lease continues from the last renewal that took.
func (l *lease) end() error {
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	if l.call == nil {
		// A renewal queued behind a busy pool is abandoned, not waited for.
		l.stop()
	}
	// A marked call's renewal in flight is waited for (its deadline bounds
	// it): abandoned, the server might still apply it after the commit
	// that ends the mark, and hold the key for another lease and grace.
	l.ticks.Wait()
	l.stop()
	l.mu.Lock()
	err, from := l.err, l.from
	l.mu.Unlock()
	if from.After(l.a.leaseFrom) {
		l.a.leaseFrom = from
	}
	return err
}

// release stops renewing, if end has not, and ends the lease's context:
// deferred, so that no renewal outlives the work, whichever way it ended
// (a crash included: a dead process renews nothing).
func (l *lease) release() {
	_ = l.end()
	l.cancel(nil)
}

// callEnded marks the key's foreign call as over, best effort: when it was
// sent, no other attempt may take the key for Config.CallGrace from now,
// the time the downstream may still act on what it received; when nothing
// was sent, the mark ends now. When this fails the mark set before the call
// stands, which only waits longer.
func (a *attempt) callEnded(ctx context.Context, sentCall bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var grace time.Duration
	if sentCall {
		grace = a.r.cfg.CallGrace
	}
	sent := time.Now()
	if ok, err := a.r.store.Renew(ctx, a.r.poolFor(a.scope), a.scope, a.key, a.token, &grace); err == nil && ok {
		a.leaseFrom = sent
	}
}

// leaseCause is err, or the lease's loss when that is what ended it.
func leaseCause(l *lease, err error) error {
	l.mu.Lock()
	lost := l.err
	l.mu.Unlock()
	if lost != nil && !errors.Is(err, ErrLockLost) {
		return fmt.Errorf("%w (%v)", lost, err)
	}
	return err
}
