package atomicphase_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// An operator's actions stay on record after the key is gone: forget
// deletes the row, not its trail.
func TestAuditTrailOutlivesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf := atomicphase.MustWorkflow("audited", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("answer", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)

	require.ErrorContains(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Action: "forget"}), "needs its Actor")
	require.ErrorContains(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "x",
		Detail: []byte("{")}), "not JSON")
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "inspect",
		Note: "customer asked"}))
	require.NoError(t, b.runner.Forget(b.ctx, "driver_1", "k"))
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "forget",
		Note: "stored answer came from a since-fixed bug", Detail: []byte(`{"ticket":"OPS-7"}`)}))
	_, err = b.runner.Inspect(b.ctx, "driver_1", "k")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)

	trail, err := b.runner.AuditTrail(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	require.Len(t, trail, 2)
	require.Equal(t, "forget", trail[0].Action, "newest first")
	require.Equal(t, "ana", trail[0].Actor)
	require.JSONEq(t, `{"ticket":"OPS-7"}`, string(trail[0].Detail))
	require.Equal(t, "customer asked", trail[1].Note)
	require.False(t, trail[0].At.IsZero())

	trail, err = b.runner.AuditTrail(b.ctx, "driver_2", "k", 0)
	require.NoError(t, err)
	require.Empty(t, trail, "another scope's key of the same name has its own trail")
}

// A note or a detail without bound would grow a trail that is kept for
// its retention and shown on the key's page: RecordAudit refuses them.
func TestAuditEntryIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	err := b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: "k", Actor: "ana", Action: "resolve",
		Note: strings.Repeat("n", 900_000)})
	require.ErrorContains(t, err, "the most is 2000 (MaxAuditNote)")
	err = b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: "k", Actor: "ana", Action: "resolve",
		Detail: []byte(`"` + strings.Repeat("d", atomicphase.MaxAuditDetail) + `"`)})
	require.ErrorContains(t, err, "(MaxAuditDetail)")
	trail, err := b.runner.AuditTrail(b.ctx, "s", "k", 0)
	require.NoError(t, err)
	require.Empty(t, trail, "nothing was recorded")
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: "k", Actor: "ana", Action: "resolve",
		Note: strings.Repeat("n", atomicphase.MaxAuditNote)}))
}

// The trail reads page by page: each page after the last entry of the one
// before, every entry once, however many a bulk action added.
func TestAuditTrailBeforePages(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range 25 {
		require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: "k", Actor: "ana", Action: "unpark",
			Note: strconv.Itoa(i)}))
	}
	var notes []string
	var before int64
	for {
		page, err := b.runner.AuditTrailBefore(b.ctx, "s", "k", before, 10)
		require.NoError(t, err)
		for _, e := range page {
			notes = append(notes, e.Note)
		}
		if len(page) < 10 {
			break
		}
		before = page[len(page)-1].ID
	}
	require.Len(t, notes, 25)
	for i, n := range notes {
		require.Equal(t, strconv.Itoa(24-i), n, "newest first, each once")
	}
}

// The sweep reaps the audit entries older than AuditRetention, at most once
// an hour per Sweeper; a negative retention keeps them.
func TestSweepReapsTheAuditTrail(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range 5 {
		require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "s", Key: "k", Actor: "ana", Action: "unpark",
			Note: strconv.Itoa(i)}))
	}
	age := func(n int) {
		_, err := b.db.Pool.Exec(b.ctx, `UPDATE atomicphase_audit SET at = now() - interval '500 days'
			WHERE id IN (SELECT id FROM atomicphase_audit WHERE at > now() - interval '1 day' ORDER BY id LIMIT $1)`, n)
		require.NoError(t, err)
	}
	age(2)
	keep, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{AuditRetention: -1})
	require.NoError(t, err)
	res, err := keep.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.ReapedAudit, "a negative retention keeps every entry")

	sweeper, err := atomicphase.NewSweeper(b.runner, nil)
	require.NoError(t, err)
	res, err = sweeper.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.ReapedAudit, "the entries older than the default 400 days")
	trail, err := b.runner.AuditTrail(b.ctx, "s", "k", 0)
	require.NoError(t, err)
	require.Len(t, trail, 3)
	require.Equal(t, "2", trail[2].Note, "the oldest entries went")

	age(1)
	res, err = sweeper.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.ReapedAudit, "once an hour per Sweeper: the table has no index on its time")
	n, err := b.runner.ReapAudit(b.ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
