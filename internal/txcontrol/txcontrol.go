// Package txcontrol finds transaction control in SQL text: the statements
// that would end, or begin anew, the transaction they are sent in (COMMIT,
// ROLLBACK, BEGIN and their synonyms). A phase's transaction refuses them
// before they are sent, since a phase that commits its own writes makes them
// outlive the phase's failure; the apvet analyzer flags them in string
// constants.
package txcontrol

import "strings"

// Find returns the first statement of sql that is transaction control, as
// written, and true; or "", false when there is none. It splits sql into
// statements at semicolons outside quotes, dollar quotes and comments, as
// the server does for a simple-protocol query carrying several statements.
// ROLLBACK TO SAVEPOINT, SAVEPOINT and RELEASE stay inside the transaction
// and are not transaction control here; SET TRANSACTION only sets its
// characteristics.
func Find(sql string) (string, bool) {
	if strings.IndexByte(sql, ';') < 0 {
		// One statement: its first words say it.
		if isControl(firstWords(sql)) {
			return strings.TrimSpace(sql), true
		}
		return "", false
	}
	for start := 0; start < len(sql); {
		end := statementEnd(sql, start)
		if isControl(firstWords(sql[start:end])) {
			return strings.TrimSpace(sql[start:end]), true
		}
		start = end + 1
	}
	return "", false
}

// isControl reports whether a statement beginning with words (at most two)
// ends or begins a transaction.
func isControl(words [2]string) bool {
	w, next := words[0], words[1]
	switch len(w) {
	case 3:
		return strings.EqualFold(w, "end")
	case 5:
		return strings.EqualFold(w, "abort") || strings.EqualFold(w, "begin") ||
			strings.EqualFold(w, "start") && strings.EqualFold(next, "transaction")
	case 6:
		return strings.EqualFold(w, "commit")
	case 7:
		return strings.EqualFold(w, "prepare") && strings.EqualFold(next, "transaction")
	case 8:
		return strings.EqualFold(w, "rollback") && !strings.EqualFold(next, "to")
	}
	return false
}

// firstWords returns the first two words of stmt, skipping whitespace and
// comments.
func firstWords(stmt string) [2]string {
	var out [2]string
	i := 0
	for n := range out {
		i = skipSpace(stmt, i)
		j := i
		for j < len(stmt) && isWordByte(stmt[j]) {
			j++
		}
		if j == i {
			break
		}
		out[n] = stmt[i:j]
		i = j
	}
	return out
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// skipSpace skips whitespace and comments from i.
func skipSpace(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v':
			i++
		case strings.HasPrefix(s[i:], "--"):
			i = lineEnd(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = commentEnd(s, i)
		default:
			return i
		}
	}
	return i
}

func lineEnd(s string, i int) int {
	if n := strings.IndexByte(s[i:], '\n'); n >= 0 {
		return i + n + 1
	}
	return len(s)
}

// commentEnd returns the index after the block comment at i, which may
// nest, as PostgreSQL's do.
func commentEnd(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// statementEnd returns the index of the semicolon ending the statement
// that starts at i, or len(s).
func statementEnd(s string, i int) int {
	for i < len(s) {
		c := s[i]
		switch {
		case c == ';':
			return i
		case c == '-' && strings.HasPrefix(s[i:], "--"):
			i = lineEnd(s, i)
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			i = commentEnd(s, i)
		case c == '\'':
			// E'…' strings take backslash escapes.
			escapes := i > 0 && (s[i-1] == 'e' || s[i-1] == 'E') && (i == 1 || !isWordByte(s[i-2]))
			i = quoteEnd(s, i, '\'', escapes)
		case c == '"':
			i = quoteEnd(s, i, '"', false)
		case c == '$':
			i = dollarEnd(s, i)
		case isWordByte(c):
			for i < len(s) && isWordByte(s[i]) {
				i++
			}
		default:
			i++
		}
	}
	return len(s)
}

// quoteEnd returns the index after the quoted text opening at i; a doubled
// quote is a quote inside.
func quoteEnd(s string, i int, q byte, escapes bool) int {
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if escapes {
				i++
			}
		case q:
			if i+1 < len(s) && s[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(s)
}

// dollarEnd returns the index after the dollar-quoted text opening at i
// ($$…$$ or $tag$…$tag$), or after the lone $ of a parameter ($1).
func dollarEnd(s string, i int) int {
	j := i + 1
	for j < len(s) && (isWordByte(s[j]) && s[j] != '$') {
		j++
	}
	if j >= len(s) || s[j] != '$' || j > i+1 && s[i+1] >= '0' && s[i+1] <= '9' {
		return i + 1 // a parameter, or a $ in an identifier
	}
	tag := s[i : j+1]
	if n := strings.Index(s[j+1:], tag); n >= 0 {
		return j + 1 + n + len(tag)
	}
	return len(s)
}

// RowStatements reports whether every statement of sql reads or writes rows
// and nothing else: each begins with SELECT, INSERT, UPDATE, DELETE, MERGE,
// WITH, VALUES or TABLE. Such statements behave alike inside a transaction
// block and in the implicit transaction of a batch sent without BEGIN;
// others may not (LOCK TABLE and DECLARE need a block, and a procedure's
// COMMIT, refused inside one, commits an implicit transaction's earlier
// statements). A statement beginning otherwise (a parenthesis, a comment
// only) makes it false.
func RowStatements(sql string) bool {
	if strings.IndexByte(sql, ';') < 0 {
		return isRowStatement(firstWords(sql)[0])
	}
	seen := false
	for start := 0; start < len(sql); {
		end := statementEnd(sql, start)
		if w := firstWords(sql[start:end])[0]; w != "" || strings.TrimSpace(sql[start:end]) != "" {
			if !isRowStatement(w) {
				return false
			}
			seen = true
		}
		start = end + 1
	}
	return seen
}

func isRowStatement(w string) bool {
	for _, k := range [...]string{"select", "insert", "update", "delete", "merge", "with", "values", "table"} {
		if strings.EqualFold(w, k) {
			return true
		}
	}
	return false
}
