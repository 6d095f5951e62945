package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A statement the server refused to prepare because of its text is left
// to the batch for retryRefusedAfter, then tried by name again; one whose
// preparation failed for any other reason is tried again by the next
// batch.
func TestAssumedStatementsRetryARefusal(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	s := newAssumedStatements()
	s.now = func() time.Time { return now }
	const sql = `INSERT INTO t VALUES ($1)`

	require.True(t, s.admit(sql), "a new text")
	for _, err := range []error{
		context.Canceled,
		context.DeadlineExceeded,
		errors.New("read tcp: connection reset by peer"),
		&pgconn.PgError{Code: "55P03"}, // lock_not_available
		&pgconn.PgError{Code: "57014"}, // query_canceled
		&pgconn.PgError{Code: "53300"}, // too_many_connections
		&pgconn.PgError{Code: "40P01"}, // deadlock_detected
		&pgconn.PgError{Code: "XX000"},
		&pgconn.PgError{Code: ""},
	} {
		require.False(t, s.refuse(sql, err), "%v", err)
		require.True(t, s.admit(sql), "after a failure that says nothing of the text: %v", err)
	}

	for _, code := range []string{"42P01", "42883", "42601", "3F000", "0A000", "22P02", "26000"} {
		s := newAssumedStatements()
		s.now = func() time.Time { return now }
		require.True(t, s.admit(sql))
		require.True(t, s.refuse(sql, fmt.Errorf("prepare: %w", &pgconn.PgError{Code: code})), code)
		require.False(t, s.admit(sql), "%s: refused", code)
		s.now = func() time.Time { return now.Add(retryRefusedAfter - time.Nanosecond) }
		require.False(t, s.admit(sql), "%s: refused until retryRefusedAfter has passed", code)
		s.now = func() time.Time { return now.Add(retryRefusedAfter) }
		require.True(t, s.admit(sql), "%s: tried again once retryRefusedAfter has passed", code)
		require.True(t, s.admit(sql), "%s: and prepared by name after", code)
		// Refused again: left to the batch again, from then.
		s.now = func() time.Time { return now.Add(2 * retryRefusedAfter) }
		s.refuse(sql, &pgconn.PgError{Code: code})
		require.False(t, s.admit(sql), "%s: refused again", code)
	}
}

// The bound on the texts counts a refused one, which takes no more room
// when it is tried again.
func TestAssumedStatementsBoundHoldsRefusals(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	s := newAssumedStatements()
	s.now = func() time.Time { return now }
	for i := range maxAssumedStatements {
		sql := fmt.Sprintf("SELECT %d", i)
		require.True(t, s.admit(sql))
		if i == 0 {
			s.refuse(sql, &pgconn.PgError{Code: "42P01"})
		}
	}
	require.False(t, s.admit("SELECT 'past the bound'"), "past the bound")
	require.False(t, s.admit("SELECT 0"), "refused")
	s.now = func() time.Time { return now.Add(retryRefusedAfter) }
	require.True(t, s.admit("SELECT 0"), "a refused text tried again, past the bound")
	require.Len(t, s.texts, maxAssumedStatements)
}
