package atomicphase

import (
	"context"
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
// the attempt treats it as the end. When a renewal fails (the token moved
// on) or cannot be made before that deadline (the database is out of
// reach), the lease cancels the context of the work it covers, with
// ErrLockLost as the cause, and the attempt commits nothing afterwards: a
// call's context never outlives the lease.
//
// A foreign call is also marked on the row (call_until) before it goes out:
// until the lease it runs under has ended plus Config.CallGrace, no other
// attempt may take the key, so none reconciles or calls while this call may
// still be in flight (docs/concepts.md, "Leases").

// errLeaseExpired is the cause of a lease that could not be renewed in
// time.
var errLeaseExpired = fmt.Errorf("%w: the lease could not be renewed before it ended", ErrLockLost)

// lease renews an attempt's hold on its key while it works.
type lease struct {
	a      *attempt
	ttl    time.Duration
	call   *time.Duration // the call mark renewals set, or nil
	cancel context.CancelCauseFunc

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
	if call {
		d := l.ttl + a.r.cfg.CallGrace
		l.call = &d
		sent := time.Now()
		ok, err := a.r.store.Renew(ctx, a.r.poolFor(a.scope), a.scope, a.key, a.token, l.call)
		switch {
		case err != nil:
			l.cancel(nil)
			return nil, nil, storeError("mark a foreign call", err)
		case !ok:
			l.cancel(nil)
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

// tick renews the lease, or ends it when its deadline has passed.
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
	if !time.Now().Before(deadline) {
		l.lose(errLeaseExpired)
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
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
	default:
		// Out of reach: try again soon, until the deadline.
		retry := min(l.ttl/10, time.Until(deadline))
		l.timer = time.AfterFunc(max(retry, 0), l.tick)
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

// end stops renewing and returns ErrLockLost (wrapped) when the lease was
// lost or ran out, or is about to: what the work produced must then not be
// committed. The attempt's lease continues from the last renewal that took.
func (l *lease) end() error {
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	err := l.err
	from := l.from
	l.mu.Unlock()
	l.ticks.Wait()
	if from.After(l.a.leaseFrom) {
		l.a.leaseFrom = from
	}
	if err == nil && !time.Now().Before(from.Add(l.ttl)) {
		err = errLeaseExpired
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
