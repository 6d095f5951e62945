package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase/internal/safetext"

	"github.com/atomicphase/atomicphase"
)

// keySummary is a key as `keys --json` prints it, one JSON object a line.
// Absent values are null rather than missing, so every line has the same
// members.
type keySummary struct {
	Scope         string     `json:"scope"`
	Key           string     `json:"key"`
	Workflow      string     `json:"workflow"`
	Status        string     `json:"status"`
	RecoveryPoint string     `json:"recovery_point"`
	Attempts      int        `json:"attempts"`
	LastError     *string    `json:"last_error"`
	Locked        bool       `json:"locked"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	ParkedAt      *time.Time `json:"parked_at"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	FinishedAt    *time.Time `json:"finished_at"`
}

// keyDetail is a key as `inspect --json` prints it: the summary and the
// rest of what Inspect returns.
type keyDetail struct {
	keySummary
	// WorkflowVersion is the version the key started under ("" before
	// versions were recorded).
	WorkflowVersion string `json:"workflow_version"`
	// DownstreamKeys are the downstream keys of the phases named with
	// --phase, by phase; null when none was.
	DownstreamKeys map[string]string `json:"downstream_keys"`
	LockToken      int64             `json:"lock_token"`
	LockExpiresIn  *float64          `json:"lock_expires_in_seconds"`
	// Unsettled says the key may have paid (forget refuses it); CalledAt
	// and DownstreamSalt say since when and what its references derive
	// from.
	Unsettled      bool            `json:"unsettled"`
	CalledAt       *time.Time      `json:"called_at"`
	DownstreamSalt string          `json:"downstream_salt,omitempty"`
	State          json.RawMessage `json:"state"`
	Response       *responseDetail `json:"response"`
	// Audit is the key's audit trail, newest first.
	Audit []*atomicphase.AuditEntry `json:"audit"`
	// History is what went wrong with the key, oldest first
	// (Runner.KeyHistory).
	History []*atomicphase.KeyEvent `json:"history"`
}

// responseDetail is a stored response. The body is text when it is UTF-8
// (BodyEncoding "text"), else base64 ("base64").
type responseDetail struct {
	Status       int         `json:"status"`
	Header       http.Header `json:"header"`
	Body         string      `json:"body"`
	BodyEncoding string      `json:"body_encoding"`
}

func summarize(k *atomicphase.KeyInfo) keySummary {
	return keySummary{
		Scope: k.Scope, Key: k.Key, Workflow: k.Workflow, Status: string(k.Status),
		RecoveryPoint: k.RecoveryPoint, Attempts: k.Attempts, LastError: k.LastError, Locked: k.Locked,
		NextAttemptAt: utcPtr(k.NextAttemptAt), ParkedAt: utcPtr(k.ParkedAt),
		CreatedAt: k.CreatedAt.UTC(), UpdatedAt: k.UpdatedAt.UTC(), FinishedAt: utcPtr(k.FinishedAt),
	}
}

func detail(k *atomicphase.KeyInfo) keyDetail {
	d := keyDetail{keySummary: summarize(k), WorkflowVersion: k.WorkflowVersion, DownstreamKeys: k.DownstreamKeys,
		LockToken: k.LockToken, LockExpiresIn: k.LockExpiresIn,
		Unsettled: k.Unsettled, CalledAt: utcPtr(k.CalledAt), DownstreamSalt: k.DownstreamSalt}
	switch {
	case k.State == nil:
	case json.Valid(k.State):
		d.State = k.State
	default: // the library stores what json.Marshal made, so this is not expected
		d.State, _ = json.Marshal(base64.StdEncoding.EncodeToString(k.State))
	}
	if resp := k.Response; resp != nil {
		body, enc := bodyText(resp.Body)
		d.Response = &responseDetail{Status: resp.Status, Header: resp.Header, Body: body, BodyEncoding: enc}
	}
	return d
}

// bodyText returns body as text if it is UTF-8, else as base64, and which.
func bodyText(body []byte) (text, encoding string) {
	if utf8.Valid(body) {
		return string(body), "text"
	}
	return base64.StdEncoding.EncodeToString(body), "base64"
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// timeCell formats a time for a table or a field: UTC, to the second.
func timeCell(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func timePtrCell(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return timeCell(*t)
}

// cell makes s safe for one cell of a tab-separated table: "-" when empty,
// quoted when it holds a tab, a newline or another control character.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// terminalSafe escapes what a terminal or a page would obey (safetext.Escape).
func terminalSafe(s string) string { return safetext.Escape(s) }

// oneLine folds a message onto one line, for a table cell.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// truncate shortens s to at most n runes, marking the cut with an ellipsis.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// shellQuote quotes s for a command an operator may paste into a shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("-_.:/@+=,", r)))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
