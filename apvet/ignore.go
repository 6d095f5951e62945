package apvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// The rules, by the names a finding is reported and suppressed under.
const (
	ruleHandle         = "handle"          // a database handle other than the phase's tx
	ruleTxControl      = "tx-control"      // transaction control in a phase
	ruleLocalIO        = "local-io"        // network I/O in a local phase
	ruleUnguardedIO    = "unguarded-io"    // network I/O in a foreign phase outside call.Do
	ruleOneCall        = "one-call"        // more than one call, or request, per foreign phase
	ruleAsyncCall      = "async-call"      // a request sent from a goroutine inside call.Do
	ruleKey            = "key"             // a call that is not given the downstream key
	ruleRetryingClient = "retrying-client" // an HTTP client that retries on its own
	ruleTxGoroutine    = "tx-goroutine"    // the phase's tx used from a goroutine
	ruleTxStored       = "tx-stored"       // the phase's tx stored where it outlives the phase
	ruleIgnore         = "ignore"          // a suppression that is malformed or unused
)

var rules = []string{ruleHandle, ruleTxControl, ruleLocalIO, ruleUnguardedIO, ruleOneCall, ruleAsyncCall,
	ruleKey, ruleRetryingClient, ruleTxGoroutine, ruleTxStored}

// ignorePrefix starts a suppression: //apvet:ignore RULE[,RULE…] REASON.
const ignorePrefix = "//apvet:ignore"

// reporter collects a package's findings, so that the suppressions in its
// files can be applied (and the unused ones reported) once all are known.
type reporter struct {
	pass     *analysis.Pass
	findings []finding
	seen     map[string]bool
}

type finding struct {
	pos  token.Pos
	rule string
	msg  string
}

func newReporter(pass *analysis.Pass) *reporter {
	return &reporter{pass: pass, seen: map[string]bool{}}
}

// report records a finding of rule at pos; the same finding twice (a
// phase function seen from two sides) is recorded once.
func (r *reporter) report(pos token.Pos, rule, format string, args ...any) {
	msg := fmt.Sprintf(format, args...) + " [" + rule + "]"
	id := fmt.Sprint(pos) + msg
	if r.seen[id] {
		return
	}
	r.seen[id] = true
	r.findings = append(r.findings, finding{pos, rule, msg})
}

// directive is one //apvet:ignore comment: it covers the findings of its
// rules on its own line (a comment after code) or on the next line (a
// comment on a line of its own).
type directive struct {
	pos   token.Pos
	file  string
	line  int
	rules []string
	used  bool
}

// flush reports the findings no directive covers, then each directive that
// is malformed (no rule, an unknown rule, no reason) or covered nothing: a
// suppression left behind after its finding went away hides the next one.
func (r *reporter) flush() {
	var dirs []*directive
	for _, f := range r.pass.Files {
		for _, group := range f.Comments {
			for _, c := range group.List {
				if d := r.parse(c); d != nil {
					dirs = append(dirs, d)
				}
			}
		}
	}
	for _, f := range r.findings {
		p := r.pass.Fset.Position(f.pos)
		covered := false
		for _, d := range dirs {
			if d.file == p.Filename && d.line == p.Line && slices.Contains(d.rules, f.rule) {
				d.used, covered = true, true
			}
		}
		if !covered {
			r.pass.Report(analysis.Diagnostic{Pos: f.pos, Category: f.rule, Message: f.msg})
		}
	}
	for _, d := range dirs {
		if !d.used {
			r.pass.Report(analysis.Diagnostic{Pos: d.pos, Category: ruleIgnore,
				Message: fmt.Sprintf("this %s %s suppresses no finding: remove it [%s]", ignorePrefix, strings.Join(d.rules, ","), ruleIgnore)})
		}
	}
}

// parse reads c as a directive; a malformed one is reported and nil.
func (r *reporter) parse(c *ast.Comment) *directive {
	rest, ok := strings.CutPrefix(c.Text, ignorePrefix)
	if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
		return nil
	}
	fields := strings.Fields(rest)
	bad := func(format string, args ...any) *directive {
		r.pass.Report(analysis.Diagnostic{Pos: c.Pos(), Category: ruleIgnore,
			Message: fmt.Sprintf(format, args...) + "; write " + ignorePrefix + " RULE REASON, RULE one of " + strings.Join(rules, ", ") + " [" + ruleIgnore + "]"})
		return nil
	}
	if len(fields) == 0 {
		return bad("%s names no rule", ignorePrefix)
	}
	names := strings.Split(fields[0], ",")
	for _, n := range names {
		if !slices.Contains(rules, n) {
			return bad("%s names the unknown rule %q", ignorePrefix, n)
		}
	}
	if len(fields) == 1 {
		return bad("%s %s gives no reason: say why the finding is wrong here", ignorePrefix, fields[0])
	}
	p := r.pass.Fset.Position(c.Pos())
	d := &directive{pos: c.Pos(), file: p.Filename, line: p.Line, rules: names}
	if r.aloneOnLine(p) {
		d.line++
	}
	return d
}

// aloneOnLine reports whether only blanks precede position p on its line.
func (r *reporter) aloneOnLine(p token.Position) bool {
	if r.pass.ReadFile == nil {
		return p.Column == 1
	}
	src, err := r.pass.ReadFile(p.Filename)
	if err != nil || p.Offset > len(src) {
		return p.Column == 1
	}
	line := src[p.Offset-(p.Column-1) : p.Offset]
	return strings.TrimSpace(string(line)) == ""
}
