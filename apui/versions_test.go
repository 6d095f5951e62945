package apui

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// transferVersions are two versions of a transfer workflow: version 1
// records the transfer; version 2 checks it for fraud first, and its fraud
// check fails (the key waits there).
func transferVersions(t *testing.T) (v1, v2 *atomicphase.Workflow[state]) {
	t.Helper()
	start := func(_ struct{}, req *atomicphase.Request) (state, error) { return state{Item: req.Key}, nil }
	record := atomicphase.Local("record_transfer", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
		return atomicphase.Respond(201, []byte(`{}`)), nil
	})
	v1 = atomicphase.MustWorkflow("transfer", start, []atomicphase.Phase[state]{record}, &atomicphase.WorkflowOpts{Version: "1"})
	v2 = atomicphase.MustWorkflow("transfer", start, []atomicphase.Phase[state]{
		atomicphase.Local("fraud_check", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, errors.New("fraud service: timeout")
		}),
		record,
	}, &atomicphase.WorkflowOpts{Version: "2"})
	return v1, v2
}

// A key of version 2 waiting at its fraud check shows version 2's phases,
// with the fraud check next, though version 1 was registered first; the
// versions page lists both with their drain state.
func TestKeyPageShowsItsOwnVersionsPhases(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v1, v2 := transferVersions(t)
	require.NoError(t, b.runner.Register(v1, v2))
	_, err := b.runner.Run(b.ctx, v2, atomicphase.Request{Scope: "gina", Key: "transfer-2", Method: "POST", Path: "/transfers"})
	require.ErrorContains(t, err, "fraud service")
	require.NoError(t, b.runner.RecordVersions(b.ctx))

	code, body := b.get(t, "/key?scope=gina&key=transfer-2")
	require.Equal(t, http.StatusOK, code, body)
	txt := text(body)
	require.Contains(t, txt, "workflow transfer version 2")
	require.Contains(t, txt, "Phases of version 2 fraud_check next record_transfer")
	require.NotContains(t, txt, "record_transfer next")

	code, body = b.get(t, "/versions")
	require.Equal(t, http.StatusOK, code, body)
	txt = text(body)
	require.Contains(t, txt, "transfer 1 record_transfer a process, seen")
	require.Regexp(t, `transfer 2 fraud_check → record_transfer a process, seen .* \(this one too\) 1 0 0 .* not drained`, txt)
	require.Regexp(t, `transfer 1 .* 0 0 0 · drained`, txt)

	var vs struct {
		Versions []struct {
			Workflow   string
			Version    string
			Unfinished int
			Drained    bool `json:"drained"`
		} `json:"versions"`
	}
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/versions", "", "", &vs))
	got := map[string]bool{}
	for _, v := range vs.Versions {
		if v.Workflow == "transfer" {
			got[v.Version] = v.Drained
		}
	}
	require.Equal(t, map[string]bool{"1": true, "2": false}, got)
}

// The downstream key a key's foreign phase sent is on its page and in the
// API: the reference a partner asks for first.
func TestKeyPageShowsTheDownstreamKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.NotEmpty(t, b.labelRef)
	_, body := b.get(t, "/key?scope=frank&key=unknown-1")
	require.Contains(t, text(body), "Downstream keys foreign phase downstream key: the reference the downstream knows the call by buy_label "+b.labelRef)
	var k atomicphase.KeyInfo
	require.Equal(t, http.StatusOK, b.apiCall(t, "GET", "/api/key?scope=frank&key=unknown-1", "", "", &k))
	require.Equal(t, map[string]string{"buy_label": b.labelRef}, k.DownstreamKeys)

	_, body = b.get(t, "/key?scope=alice&key=finished-1")
	require.Contains(t, body, "The workflow has no foreign phase")

}

// A console that does not have the workflow's code (atomicphase ui) shows
// the phases the versions registry recorded for the key's version, as its
// versions page does, and the downstream key each recorded name sends if
// it is foreign; for a version no process recorded it says where to look.
func TestStandaloneKeyPageShowsTheRecordedPhases(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	h, err := NewHandler(&Options{Runner: other})
	require.NoError(t, err)
	page := text(newRecorder(h, "/key?scope=frank&key=unknown-1"))
	require.NotContains(t, page, "its phases are not known here")
	require.Contains(t, page, "its phases are as the processes that run it recorded them")
	require.Contains(t, page, "buy_label confirm Downstream keys")
	require.Contains(t, page, "phase, if foreign downstream key: the reference the downstream knows the call by buy_label "+b.labelRef)
	require.Contains(t, text(newRecorder(h, "/versions")), "buy_label → confirm")

	// A parked key: its recovery point is marked.
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET recovery_point = 'buy_label' WHERE idempotency_key = 'unknown-1'`)
	require.NoError(t, err)
	require.Contains(t, newRecorder(h, "/key?scope=frank&key=unknown-1"), `<li class="done">buy_label <span class="badge">recovery point</span></li><li class="">confirm</li>`)

	// Redaction holds on what the registry gave.
	redacting, err := NewHandler(&Options{Runner: other, Redact: func(k *atomicphase.KeyInfo) { k.DownstreamKeys = nil }})
	require.NoError(t, err)
	require.NotContains(t, newRecorder(redacting, "/key?scope=frank&key=unknown-1"), b.labelRef)

	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM atomicphase_workflow_versions WHERE workflow = 'label'`)
	require.NoError(t, err)
	page = newRecorder(h, "/key?scope=frank&key=unknown-1")
	require.Contains(t, text(page), "its phases are not known here")
	require.Contains(t, page, "atomicphase inspect --phase NAME frank unknown-1")
	require.NotContains(t, page, b.labelRef)
}

// The verdict form is only on keys whose call's outcome is unknown, and its
// example is no leftover of another workflow's.
func TestVerdictFormOnlyWhereAnOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for key, want := range map[string]bool{"bob/parked-1": false, "erin/hostile-1": false, "alice/finished-1": false, "frank/unknown-1": true} {
		scope, k, _ := strings.Cut(key, "/")
		_, body := b.get(t, "/key?scope="+scope+"&key="+k)
		require.Equal(t, want, strings.Contains(body, `id="resolve"`), key)
		require.NotContains(t, body, "lbl-1", key)
	}
}

// Every column of the overview's levels table is aligned as its numbers
// are: a count stands under its own status.
func TestLevelsTableHeadersAlignWithTheirNumbers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, body := b.get(t, "/")
	table := body[strings.Index(body, `id="levels"`):]
	table = table[:strings.Index(table, "</table>")]
	head := table[:strings.Index(table, "</thead>")]
	row := table[strings.Index(table, "<tbody>"):]
	row = row[:strings.Index(row, "</tr>")]
	heads := strings.Split(head[strings.Index(head, "<tr>"):], "<th")[1:]
	cells := strings.Split(row, "<td")[1:]
	require.Len(t, cells, len(heads))
	for i := range heads {
		require.Equal(t, strings.HasPrefix(cells[i], ` class="num"`), strings.HasPrefix(heads[i], ` class="num"`),
			"column %d: %s over %s", i, heads[i], cells[i])
	}
}
