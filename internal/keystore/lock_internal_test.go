package keystore

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// The read ahead of an assumed recording answers the claim's refusal as
// the recording's own refusal would be answered (Read), whether it came
// after the read's row or, should a plan ever run the claim first,
// without it: a key recorded meanwhile is ErrNotRecorded for a recording
// at the head of its unit and the server's error for the claim's, a
// recording in flight the server's error; either way the recording was
// sent, and the key is another request's. Any other error says nothing
// of the key.
func TestRefusedAheadAnswersAsTheRecordingWould(t *testing.T) {
	recorded := &pgconn.PgError{Code: RecordedMeanwhileCode}
	inFlight := &pgconn.PgError{Code: RecordingInFlightCode}
	other := &pgconn.PgError{Code: "57014"}
	lost := errors.New("connection lost")
	for _, tc := range []struct {
		name  string
		first bool
		err   error
		want  error
		sent  bool
	}{
		{"recorded, at the head", true, recorded, ErrNotRecorded, true},
		{"recorded, claim alone", false, recorded, recorded, true},
		{"in flight, at the head", true, inFlight, inFlight, true},
		{"in flight, claim alone", false, inFlight, inFlight, true},
		{"cancelled", true, other, other, false},
		{"connection lost", false, lost, lost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &Recording{first: tc.first}
			require.Same(t, tc.want, rec.refusedAhead(tc.err))
			require.Equal(t, tc.sent, rec.Sent)
			require.False(t, rec.Recorded)
		})
	}
}
