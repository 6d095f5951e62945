package keystore

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// PeekSQL is the replay's read, for the plan test.
const PeekSQL = peekSQL

// AbandonedSQL, UnknownSQL and ReapSQL (the reap's pick) are the sweep's reads of the key table, for the
// plan tests.
const (
	AbandonedSQL = abandonedSQL
	UnknownSQL   = unknownSQL
	ReapSQL      = reapPickSQL
	PassedSQL    = passedSQL
)

// JudgeLease is the key's read's judgement of its holding, for the test
// that holds it to the database's functions.
func JudgeLease(lockedAt pgtype.Timestamptz, leaseUs int64, callUntil pgtype.Timestamptz, now time.Time) (takeable, live bool, expiresIn *float64) {
	var l leaseJudgement
	l.judge(lockedAt, leaseUs, callUntil, now)
	if l.expires {
		expiresIn = &l.expiresIn
	}
	return l.takeable, l.live, expiresIn
}

// MicrosTime is the key's read's decoding of a time it returned as
// microseconds since the Unix epoch.
func MicrosTime(us pgtype.Int8) pgtype.Timestamptz { return microsTime(us) }
