package keystore_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

// A replay is one read of its key, which returns the key's lock columns
// as they are (the lock, the lease, the foreign call's quiet period) and
// the database's now; the client judges them by the rules of
// atomicphase_held_until and atomicphase_lock_expires, so that the read
// prepares no expression for them (they cost replays about a tenth of
// their rate: docs/performance.md). The judgement must be the database's,
// to the microsecond, for every combination: unlocked or locked long ago,
// just now or in a moment, a stored lease or none (the lock timeout), no
// call's quiet period or one that ended or ends before, at or after the
// lease.
func TestPeekJudgesTheLeaseAsTheDatabaseDoes(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	ctx := t.Context()
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	const timeoutUs = 90_000_000
	at := func(d time.Duration) pgtype.Timestamptz { return pgtype.Timestamptz{Time: now.Add(d), Valid: true} }
	none := pgtype.Timestamptz{}
	locks := []pgtype.Timestamptz{none, at(-2 * time.Hour), at(-91 * time.Second), at(-90 * time.Second), at(-30 * time.Second),
		at(-time.Microsecond), at(0), at(time.Second)}
	leases := []*int64{nil, ptr(int64(0)), ptr(int64(1)), ptr(int64(30_000_000)), ptr(int64(3_600_000_000))}
	calls := []pgtype.Timestamptz{none, at(-time.Hour), at(-time.Microsecond), at(0), at(time.Microsecond), at(10 * time.Second),
		at(60 * time.Second), at(2 * time.Hour)}
	n := 0
	for _, locked := range locks {
		for _, lease := range leases {
			for _, call := range calls {
				var takeable, live bool
				var expiresIn *float64
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT
					coalesce(atomicphase_held_until(l, s, c, o) < n, true),
					coalesce(l + coalesce(s, o) * interval '1 microsecond' >= n, false),
					extract(epoch FROM atomicphase_lock_expires(l, s, c, o, n) - n)::float8
					FROM (SELECT $1::timestamptz, $2::bigint, $3::timestamptz, $4::bigint, $5::timestamptz) AS a (l, s, c, o, n)`,
					locked, lease, call, int64(timeoutUs), now).Scan(&takeable, &live, &expiresIn))
				us := int64(timeoutUs)
				if lease != nil {
					us = *lease
				}
				gotTakeable, gotLive, gotExpires := keystore.JudgeLease(locked, us, call, now)
				what := fmt.Sprintf("locked %v, lease %v, call until %v", locked, lease, call)
				require.Equal(t, takeable, gotTakeable, "takeable: "+what)
				require.Equal(t, live, gotLive, "live: "+what)
				if expiresIn == nil {
					require.Nil(t, gotExpires, "expires: "+what)
				} else {
					require.NotNil(t, gotExpires, "expires: "+what)
					require.Equal(t, *expiresIn, *gotExpires, "expires: "+what)
				}
				n++
			}
		}
	}
	require.Equal(t, len(locks)*len(leases)*len(calls), n)
}

func ptr[T any](v T) *T { return &v }

// The key's read returns its times as microseconds since the Unix epoch
// (date_part's float8, exact to the microsecond for the years a key can
// carry, cast to int8 on the server), which the client turns back into the
// time, in every exec mode, whatever the session's extra_float_digits (a
// float8 sent as text would lose digits to it).
func TestTheKeysReadReturnsItsTimesToTheMicrosecond(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	ctx := t.Context()
	times := []time.Time{
		time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 27, 12, 0, 0, 123456000, time.UTC),
		time.Date(2026, 11, 27, 23, 59, 59, 999999000, time.UTC),
		time.Date(2038, 1, 19, 3, 14, 7, 999999000, time.UTC),
		time.Date(2199, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC),
	}
	for i := range 1000 {
		times = append(times, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).Add(time.Duration(i*7919+i*i*104729)*time.Microsecond))
	}
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, digits := range []int{1, 0, -15} {
		_, err := conn.Exec(ctx, fmt.Sprintf("SET extra_float_digits = %d", digits))
		require.NoError(t, err)
		for _, want := range times {
			var us pgtype.Int8
			require.NoError(t, conn.QueryRow(ctx, `SELECT (date_part('epoch', $1::timestamptz) * 1000000::float8)::int8`, want).Scan(&us))
			got := keystore.MicrosTime(us)
			require.True(t, got.Valid)
			require.True(t, want.Equal(got.Time), "%v came back as %v (extra_float_digits %d)", want, got.Time, digits)
		}
	}
	_, err = conn.Exec(ctx, "RESET extra_float_digits")
	require.NoError(t, err)
	var null pgtype.Int8
	require.NoError(t, conn.QueryRow(ctx, `SELECT (date_part('epoch', NULL::timestamptz) * 1000000::float8)::int8`).Scan(&null))
	require.False(t, keystore.MicrosTime(null).Valid)
	require.Contains(t, keystore.PeekSQL, `(date_part('epoch', locked_at) * 1000000::float8)::int8`, "the expression this test holds")
}

// The sweep's statements read only what is due, and each statement has
// its index, on a key table that holds what an outage leaves: 100 000
// finished keys and 50 000 unfinished ones in backoff, none due. The
// sweep's reads (the abandoned keys, the count of unknown workflows) must
// reach the due keys through the index of keys that went wrong, so that the
// backlog is not read at each sweep; the watermark and the reap read keys
// by creation time; the per-scope count the primary key, by scope.
func TestSweepStatementsReadOnlyWhatIsDue(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "the workers plan the shards' statements")
	db := atomicphasetest.NewDB(t, nil)
	_, err := db.Pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, next_attempt_at, status)
		SELECT 's' || (i % 500), 'k' || i, 'w', '\x00', 'POST', '/', '{}', now() + interval '1 hour', 'w' FROM generate_series(1, 50000) i;
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state,
		                              recovery_point, response_status, finished_at, status)
		SELECT 'f' || (i % 500), 'k' || i, 'w', '\x00', 'POST', '/', '{}', 'finished', 200, now(), 'f' FROM generate_series(1, 100000) i;
		ANALYZE idempotency_keys`)
	require.NoError(t, err)
	args := strings.NewReplacer("$1", "'{w}'", "$2", "90000000", "$3", "50", "$4", "5", "$5", "'{}'", "$6", "'{}'")
	statements := map[string]struct {
		sql  string
		want []string
	}{
		"abandoned": {args.Replace(keystore.Render(keystore.AbandonedSQL, "")),
			[]string{"idempotency_keys_waiting_idx", "Index Cond: (next_attempt_at <= now())"}},
		"unknown": {strings.NewReplacer("$1", "'{w}'", "$2", "90000000", "$3", "1000").Replace(keystore.Render(keystore.UnknownSQL, "")),
			[]string{"idempotency_keys_waiting_idx", "Index Cond: (next_attempt_at <= now())"}},
		"reap": {strings.NewReplacer("$1", "86400000000", "$2", "1000").Replace(keystore.Render(keystore.ReapSQL, "")),
			[]string{"idempotency_keys_created_at_idx"}},
		"passed": {strings.NewReplacer("$1", "(now() - interval '1 minute')", "$2", "(now() - interval '1 second')", "$3", "1000").Replace(keystore.Render(keystore.PassedSQL, "")),
			[]string{"idempotency_keys_created_at_idx"}},
		"count": {`SELECT count(*) FROM idempotency_keys WHERE scope = 's1' AND response_status IS NULL AND parked_at IS NULL`,
			[]string{"idempotency_keys_pkey"}},
	}
	for name, st := range statements {
		rows, err := db.Pool.Query(t.Context(), "EXPLAIN "+st.sql)
		require.NoError(t, err, name)
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.NotContains(t, plan.String(), "Seq Scan on idempotency_keys", "%s:\n%s", name, plan.String())
		for _, want := range st.want {
			require.Contains(t, plan.String(), want, "%s:\n%s", name, plan.String())
		}
	}
}
