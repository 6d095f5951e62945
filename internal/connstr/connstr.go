// Package connstr parses PostgreSQL connection strings without ever putting
// any part of one into an error: pgx's parse errors quote the string, and
// mask a password only where they can recognise it, so a typo elsewhere in
// a string that holds one ("password = secret port=abc") would print it.
// The CLI, the examples and the test harness parse through here.
package connstr

import (
	"errors"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("not a PostgreSQL URL or key=value connection string")

// Parse is pgxpool.ParseConfig, whose error names what is wrong (an
// invalid port, say) without quoting s.
func Parse(s string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, Redact(err, s)
	}
	return cfg, nil
}

// Redact returns err, met while parsing or using the connection string s,
// reworded so that no part of s appears in it: pgx's "cannot parse `…`: "
// preamble is dropped, and any run of three or more characters of s that
// is not a connection parameter's name is replaced by "…". The result
// wraps ErrInvalid; nil stays nil.
func Redact(err error, s string) error {
	if err == nil {
		return nil
	}
	reason := err.Error()
	if i := strings.LastIndex(reason, "`: "); i >= 0 {
		reason = reason[i+len("`: "):]
	}
	for _, part := range parts(s) {
		reason = strings.ReplaceAll(reason, part, "…")
	}
	return errors.Join(ErrInvalid, errors.New(reason))
}

// parts are the pieces of s that could be secret: everything between the
// separators of a URL or a key=value string, three characters or longer,
// but for the names of parameters and schemes, longest first (so a longer
// piece is replaced whole before a piece of it).
func parts(s string) []string {
	fields := strings.FieldsFunc(s, func(r rune) bool {
		return strings.ContainsRune(" \t\n=&?:/@'\"\\,;", r)
	})
	var out []string
	for _, f := range fields {
		if len(f) >= 3 && !keywords[strings.ToLower(f)] {
			out = append(out, f)
		}
	}
	// Longest first.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// keywords are words a connection string holds that name, rather than
// hold, a value: libpq's parameters, pgxpool's, and the URL schemes.
var keywords = map[string]bool{
	"postgres": true, "postgresql": true, "host": true, "hostaddr": true, "port": true, "user": true,
	"password": true, "passfile": true, "dbname": true, "database": true, "sslmode": true,
	"sslcert": true, "sslkey": true, "sslrootcert": true, "sslpassword": true, "sslsni": true,
	"connect_timeout": true, "application_name": true, "search_path": true, "options": true,
	"target_session_attrs": true, "service": true, "servicefile": true, "min_read_buffer_size": true,
	"statement_cache_capacity": true, "description_cache_capacity": true,
	"default_query_exec_mode": true, "pool_max_conns": true, "pool_min_conns": true,
	"pool_min_idle_conns": true, "pool_max_conn_lifetime": true, "pool_max_conn_idle_time": true,
	"pool_health_check_period": true, "pool_max_conn_lifetime_jitter": true,
	"disable": true, "allow": true, "prefer": true, "require": true, "verify-ca": true, "verify-full": true,
	"localhost": true,
}

// secretKeyValue matches a password parameter of a key=value string and
// its value ('quoted', with \' and \\ inside, or a bare word); secretQuery
// one of a URL's query.
var (
	secretKeyValue = regexp.MustCompile(`(?i)\b((?:ssl)?password)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)`)
	secretQuery    = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&#]*`)
)

// Display returns the connection string s for a log line or a message:
// whole, but for its passwords (a URL's user:password@, its ?password= and
// ?sslpassword=, a key=value string's password= and sslpassword=), each
// written as ***.
func Display(s string) string {
	if i := strings.Index(s, "://"); i >= 0 {
		rest := s[i+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			if user, _, ok := strings.Cut(rest[:at], ":"); ok {
				rest = user + ":***" + rest[at:]
			}
		}
		return secretQuery.ReplaceAllString(s[:i+3]+rest, "${1}***")
	}
	return secretKeyValue.ReplaceAllString(s, "${1}${2}***")
}
