package keystore

// The lease, as a request's read of its key judges it: the same rules as
// atomicphase_held_until and atomicphase_lock_expires in the schema, on
// the columns the read returns (see peekSQL).

import (
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// microsTime is a time the key's read returned as microseconds since the
// Unix epoch: an int8, exact in every exec mode (a float8 sent as text
// loses digits to a session's extra_float_digits), which pgx scans without
// allocating, where a timestamptz's scan plan costs an allocation per
// column. An infinite time fails the read's cast, as it failed the
// lease's arithmetic before.
func microsTime(us pgtype.Int8) pgtype.Timestamptz {
	if !us.Valid {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: time.UnixMicro(us.Int64), Valid: true}
}

// leaseJudgement is what a request needs to know of its key's holding:
// the rules of atomicphase_held_until and atomicphase_lock_expires,
// judged here on the columns the key's read returns and the database's
// now, so that the read (the whole of a replay) prepares no expression
// for them (docs/performance.md). TestPeekJudgesTheLeaseAsTheDatabaseDoes
// holds the two together.
type leaseJudgement struct {
	// takeable: nobody holds the key: no lease and no foreign call's
	// quiet period, or both over (atomicphase_held_until is NULL or past).
	takeable bool
	// live: a lease runs (locked, and its end not past).
	live bool
	// expires, expiresIn: atomicphase_lock_expires, in seconds from now,
	// when it is not NULL.
	expires   bool
	expiresIn float64
}

// judge judges a key locked at lockedAt (NULL when unlocked) for leaseUs
// microseconds (its lease, or the lock timeout when it stored none), its
// foreign call's quiet period ending at callUntil (NULL for none), at now.
func (l *leaseJudgement) judge(lockedAt pgtype.Timestamptz, leaseUs int64, callUntil pgtype.Timestamptz, now time.Time) {
	locked := lockedAt.Valid && lockedAt.InfinityModifier == pgtype.Finite
	calling := callUntil.Valid && callUntil.InfinityModifier == pgtype.Finite
	var leaseEnd time.Time
	if locked {
		const maxUs = math.MaxInt64 / int64(time.Microsecond)
		leaseEnd = lockedAt.Time.Add(time.Duration(min(max(leaseUs, -maxUs), maxUs)) * time.Microsecond)
	}
	// held_until: the later of the lease's end and the call's, NULLs left out.
	held, isHeld := leaseEnd, locked
	if calling && (!isHeld || callUntil.Time.After(held)) {
		held, isHeld = callUntil.Time, true
	}
	l.takeable = !isHeld || held.Before(now)
	l.live = locked && !leaseEnd.Before(now)
	// lock_expires: the lease's end while it runs, when no call's quiet
	// period is set, or when that ends before the lease; else the call's.
	var expires time.Time
	switch {
	case locked && (!leaseEnd.Before(now) || !calling || callUntil.Time.Before(leaseEnd)):
		expires, l.expires = leaseEnd, true
	case calling:
		expires, l.expires = callUntil.Time, true
	default:
		l.expires = false
	}
	if l.expires {
		l.expiresIn = float64(expires.Sub(now).Microseconds()) / 1e6
	}
}
