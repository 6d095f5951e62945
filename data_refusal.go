package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// A request whose own data the database refuses (a constraint it breaks, a
// value out of range: see requestCode) meets the same refusal on every
// retry. It is not a failure to retry or to park but the request's answer:
// 422, stored on the key as its final response and replayed to every
// retry, with nothing of the failed unit kept.

// Once a foreign phase of the key may have committed, the same refusal is
// no longer the client's to fix: the call went out, and a corrected
// request under a new key would make it again (pay twice). The key parks
// instead, with the refusal as its error, for an operator to fix the
// workflow and unpark it; the client is answered as for any parked key
// (ErrParked), and the side effects stay recorded. Validating the request
// in the workflow's start function refuses bad data before anything is
// paid.

// paidRefusalError is a data refusal met after a foreign phase of the key
// may have committed: it parks the key (failUnit).
type paidRefusalError struct{ refused *dataRefusedError }

func (e *paidRefusalError) Error() string {
	return "the database refused the request's data after a foreign phase's call went out, so the key is parked rather than answered 422 (a new key would repeat the call); validate the data in the workflow's start function, or fix the phase, then unpark the key: " + e.refused.Error()
}
func (e *paidRefusalError) Unwrap() error { return e.refused.err }

// ProblemInvalidData is the problem type (RFC 9457) of the answer to a
// request whose data the database refused: docs/http.md describes it.
const ProblemInvalidData = "https://github.com/atomicphase/atomicphase/blob/main/docs/http.md#invalid-data"

// dataRefusedError is a unit's failure classed as the request's own.
type dataRefusedError struct{ err error }

func (e *dataRefusedError) Error() string { return e.err.Error() }
func (e *dataRefusedError) Unwrap() error { return e.err }

// refusalResponse is the 422 answer to a request whose data the database
// refused. It names the SQLSTATE and, when the server gave them, the
// constraint, table and column, so that a client can tell which field to
// correct; the server's message, which may quote the row's values, is not
// sent.
func refusalResponse(err error) *Response {
	problem := struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Status     int    `json:"status"`
		Detail     string `json:"detail"`
		SQLState   string `json:"sqlstate,omitempty"`
		Constraint string `json:"constraint,omitempty"`
		Table      string `json:"table,omitempty"`
		Column     string `json:"column,omitempty"`
	}{Type: ProblemInvalidData, Title: "The request's data was refused", Status: http.StatusUnprocessableEntity,
		Detail: "the database refused the data of this request (a value out of range or malformed, or a constraint it breaks); the same request will be refused again, so correct it and send it with a new Idempotency-Key"}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		problem.SQLState = pgErr.Code
		if name := pgerrcode.Name(pgErr.Code); name != "" {
			problem.Detail += " (" + name + ")"
		}
		problem.Constraint, problem.Table, problem.Column = pgErr.ConstraintName, pgErr.TableName, pgErr.ColumnName
	}
	body, _ := json.Marshal(problem) // strings only: cannot fail
	return &Response{Status: http.StatusUnprocessableEntity, Body: body,
		Header: http.Header{"Content-Type": []string{"application/problem+json"}}}
}

// answerRefusal stores the refusal of the request's data as the key's final
// response and returns it, the unit it failed in rolled back. state is the
// state the unit began with, kept with the response only when the workflow
// keeps finished states, as for any response. When the answer cannot be stored, the
// attempt fails as a transient one would: a retry meets the refusal again
// and stores it then.
func (a *attempt) answerRefusal(ctx context.Context, phase string, state []byte, refused *dataRefusedError) (*Response, error) {
	resp := refusalResponse(refused.err)
	cp := &checkpoint{point: RecoveryPointFinished, resp: resp}
	if a.wf.keepsFinishedState() {
		cp.state = state
	}
	kc, err := a.checkpointOf(cp)
	if err == nil {
		sql, args := a.r.store.Checkpoint(kc)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, err = a.r.poolFor(a.scope).Exec(cctx, sql, args...)
	}
	switch {
	case keystore.IsLockLost(err):
		return nil, a.fail(ctx, phase, ErrLockLost)
	case err != nil:
		a.log(ctx, slog.LevelWarn, "atomicphase: storing the refusal of a request's data failed", "phase", phase, "error", err)
		return nil, a.fail(ctx, phase, refused)
	}
	a.log(ctx, slog.LevelInfo, "atomicphase: request's data refused", "phase", phase, "error", refused.err)
	a.r.observe(ctx, Event{Kind: EventDataRefused, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase, Err: refused.err})
	return resp, nil
}
