package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/internal/mdanchor"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// docs/production.md is checked here (make docs-check): every fenced block
// on it is preceded by a comment "<!-- check: ID — how -->", and
// guideChecks has a check for each ID, run in the page's order by
// TestProductionGuideCommands against a real PostgreSQL and PgBouncer.
// Commands that install or start a server (apt-get, pg_conftool,
// pg_ctlcluster, docker, nginx's configuration) are not run: their checks
// read them, and hold what they pass against the test server.

const (
	productionGuide = "../../docs/production.md"
	securityGuide   = "../../docs/security-and-limits.md"
)

// guideBlock is a fenced block of the guide with the check comment before
// it.
type guideBlock struct {
	id, lang, text string
	line           int
}

var checkComment = regexp.MustCompile(`(?s)^<!-- check: ([a-z0-9-]+) — (.+) -->$`)

// readGuide returns the guide's text and its fenced blocks, each with its
// check comment; a block without one fails the test.
func readGuide(t *testing.T) (string, []guideBlock) {
	t.Helper()
	raw, err := os.ReadFile(productionGuide)
	require.NoError(t, err)
	lines := strings.Split(string(raw), "\n")
	var blocks []guideBlock
	for i := 0; i < len(lines); i++ {
		open := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(open, "```") {
			continue
		}
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
		var body []string
		j := i + 1
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
			body = append(body, strings.TrimPrefix(lines[j], indent))
		}
		require.Less(t, j, len(lines), "docs/production.md:%d: a fenced block that does not end", i+1)
		// The comment ends on the line before the fence.
		k := i - 1
		require.True(t, k >= 0 && strings.HasSuffix(strings.TrimSpace(lines[k]), "-->"),
			"docs/production.md:%d: a fenced block needs a check comment on the line before it: <!-- check: ID — how it is checked -->", i+1)
		for k >= 0 && !strings.HasPrefix(strings.TrimSpace(lines[k]), "<!--") {
			k--
		}
		var comment []string
		for _, l := range lines[max(k, 0):i] {
			comment = append(comment, strings.TrimSpace(l))
		}
		m := checkComment.FindStringSubmatch(strings.Join(comment, " "))
		require.NotNil(t, m, "docs/production.md:%d: the comment before the block is not <!-- check: ID — how -->", i+1)
		blocks = append(blocks, guideBlock{id: m[1], lang: strings.TrimPrefix(open, "```"),
			text: strings.Join(body, "\n") + "\n", line: i + 1})
		i = j
	}
	return string(raw), blocks
}

// guideCheck checks a block of the guide written in lang.
type guideCheck struct {
	lang  string
	check func(*guide, *testing.T, guideBlock)
}

// guideChecks checks each block of the guide, by its ID.
var guideChecks = map[string]guideCheck{
	"packages":          {"sh", (*guide).checkPackages},
	"container":         {"sh", (*guide).checkContainer},
	"roles":             {"sql", (*guide).checkRoles},
	"migrate":           {"sh", (*guide).checkMigrate},
	"grants":            {"sql", (*guide).checkGrants},
	"pgbouncer":         {"ini", (*guide).checkPgBouncerConfig},
	"userlist":          {"sql", (*guide).checkUserlist},
	"through-pgbouncer": {"sh", (*guide).checkThroughPgBouncer},
	"startup":           {"go", (*guide).checkStartup},
	"sweep":             {"sh", (*guide).checkSweep},
	"console":           {"sh", (*guide).checkConsole},
	"proxy":             {"nginx", (*guide).checkProxy},
	"database-alerts":   {"sql", (*guide).checkDatabaseAlerts},
	"backup":            {"sh", (*guide).checkBackup},
	"restore-database":  {"sql", (*guide).checkRestoreDatabase},
	"restore":           {"sh", (*guide).checkRestore},
	"after-restore":     {"sh", (*guide).checkAfterRestore},
	"upgrade-expand":    {"sh", (*guide).checkUpgradeExpand},
	"upgrade-watch":     {"sh", (*guide).checkUpgradeWatch},
	"upgrade-contract":  {"sh", (*guide).checkUpgradeContract},
}

// What the guide says without a command: every block has a check and
// every check a block; its links stay in the repository and reach a
// heading; the metrics it alerts on are ones the code reports; every
// command quoted in its prose is one a block runs; the defaults its
// thresholds are computed from are the library's.
func TestProductionGuideText(t *testing.T) {
	t.Parallel()
	doc, blocks := readGuide(t)
	var ids []string
	var code strings.Builder
	for _, b := range blocks {
		require.NotContains(t, ids, b.id, "docs/production.md:%d: check ID %q used twice", b.line, b.id)
		ids = append(ids, b.id)
		code.WriteString(b.text)
	}
	var checks []string
	for id := range guideChecks {
		checks = append(checks, id)
	}
	require.ElementsMatch(t, checks, ids, "every block of docs/production.md has a check in guideChecks, and every check a block")
	for _, b := range blocks {
		require.Equal(t, guideChecks[b.id].lang, b.lang, "docs/production.md:%d: block %q's language", b.line, b.id)
	}

	prose := stripBlocks(doc)
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(prose, -1) {
		target := m[1]
		require.NotRegexp(t, `^[a-z]+:`, target, "docs/production.md links only within the repository")
		file, fragment, _ := strings.Cut(target, "#")
		path := productionGuide
		if file != "" {
			path = filepath.Join(filepath.Dir(productionGuide), filepath.FromSlash(file))
		}
		text, err := os.ReadFile(path)
		require.NoError(t, err, "link %s", target)
		if fragment != "" {
			require.Contains(t, mdanchor.Anchors(stripBlocks(string(text))), fragment, "link %s: %s has no heading with that anchor", target, file)
		}
	}

	// Metrics: every atomicphase.* name in the alerts section is an event
	// counter or one of apotel's own instruments.
	known := map[string]bool{}
	for _, k := range atomicphase.EventKinds() {
		known["atomicphase."+string(k)] = true
	}
	for _, f := range []string{"../../apotel/metrics.go", "../../apotel/levels.go"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`MetricPrefix \+ "([a-z_.]+)"`).FindAllSubmatch(src, -1) {
			known["atomicphase."+string(m[1])] = true
		}
	}
	require.True(t, known["atomicphase.keys.unfinished"] && known["atomicphase.phase.duration"], "apotel's instruments are found: %v", known)
	alerts := regexp.MustCompile(`(?s)## What to alert on\n(.*?)\n## `).FindStringSubmatch(prose)
	require.NotNil(t, alerts, "docs/production.md has a section What to alert on")
	metrics := regexp.MustCompile("`(atomicphase\\.[a-z_.]+)(\\{[^}`]*\\})?`").FindAllStringSubmatch(alerts[1], -1)
	require.GreaterOrEqual(t, len(metrics), 10)
	for _, m := range metrics {
		require.True(t, known[m[1]], "docs/production.md alerts on %s, which no code reports", m[1])
		if m[2] != "" {
			label := regexp.MustCompile(`^\{status="(in_progress|stale|abandoned|unknown|parked)"\}$`)
			require.Regexp(t, label, m[2], "%s: a level's status label", m[1])
		}
	}

	// A command in the prose is one a block runs.
	commands := []string{"atomicphase", "sudo", "docker", "psql", "pg_dump", "pg_restore", "pg_ctlcluster",
		"pg_conftool", "pg_lsclusters", "apt-get", "pgbouncer", "systemctl", "initdb"}
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(prose, -1) {
		first, _, _ := strings.Cut(m[1], " ")
		if slices.Contains(commands, first) && m[1] != "initdb" {
			require.True(t, strings.Contains(code.String(), m[1]), "docs/production.md quotes the command %q, which no block runs", m[1])
		}
	}

	// The defaults the page computes its thresholds from.
	require.Equal(t, 90*time.Second, atomicphase.DefaultLockTimeout, "docs/production.md: LockTimeout 90 s, half of it 45 s")
	require.Equal(t, 5*time.Second, atomicphase.DefaultSweepInterval, "docs/production.md: Interval 5 s")
	require.Equal(t, 24*time.Hour, atomicphase.DefaultKeyRetention, "docs/production.md: Retention 24 h")
	require.Equal(t, 7*24*time.Hour, atomicphase.DefaultParkedRetention, "docs/production.md: ParkedRetention 7 days")
	require.Equal(t, 400*24*time.Hour, atomicphase.DefaultAuditRetention, "docs/production.md: AuditRetention 400 days")
	require.Equal(t, 4, atomicphase.DefaultSweepWorkers, "docs/production.md: Workers 4")
	require.Equal(t, 24*time.Hour, atomicphase.DefaultVersionHorizon, "docs/production.md: VersionHorizon")

	// Upgrading: 0.3.0's migrations 016 to 019 expand, 020 contracts.
	migrations, err := atomicphase.Migrations(nil)
	require.NoError(t, err)
	for _, m := range migrations {
		if m.Version >= 16 && m.Version <= 20 {
			require.Equal(t, m.Version == 20, m.Contract, "docs/production.md, Upgrading: migration %03d_%s", m.Version, m.Name)
		}
	}
}

// stripBlocks returns markdown without its fenced blocks and comments.
func stripBlocks(markdown string) string {
	markdown = regexp.MustCompile("(?s)<!--.*?-->").ReplaceAllString(markdown, "")
	return regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```\\s*$").ReplaceAllString(markdown, "")
}

// guide is the state the checks share, in the page's order: one server,
// the database and roles the page makes (under names of the test's own),
// the environment its shell lines export, its PgBouncer and console.
type guide struct {
	ctx       context.Context
	dir       string            // a directory every OS user may read: PgBouncer's files, the dump
	super     *pgx.ConnConfig   // the test server's superuser, database postgres
	suffix    string            // of every name the test gives a database or role
	grants    string            // the page's grants block
	names     map[string]string // the page's names to the test's
	passwords map[string]string // by the test's role names
	env       map[string]string // what the page's lines exported, rewritten
	settings  map[string]string // the packages' server settings
	bouncer   string            // host:port of the PgBouncer the page configures
	ini       string
	uiBase    string // the running console's URL
	uiListen  string // --listen and --allowed-host as the page gives them
	uiHosts   []string
	uiToken   string
	uiStop    func() (int, string)
	seed      [2]string // the scope and key the page inspects after its restore
	dumped    bool      // the backup and the restore ran
	restored  bool
	failing   atomic.Bool
	cleanups  []func() // run when the whole test ends, not the subtest that adds one
}

// TestProductionGuideCommands runs (or, for what installs or starts a
// server, reads) every block of docs/production.md, in order.
func TestProductionGuideCommands(t *testing.T) {
	t.Parallel()
	_, blocks := readGuide(t)
	db := atomicphasetest.NewDB(t, &atomicphasetest.Options{SkipMigrations: true})
	super, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	super.Database = "postgres"
	super.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	suffix := "_" + randomHex(t, 4)
	g := &guide{ctx: context.Background(), super: super, suffix: suffix, env: map[string]string{}, passwords: map[string]string{},
		names: map[string]string{}, uiToken: "ui-token-" + randomHex(t, 8)}
	for _, n := range []string{"app", "app_owner", "app_runtime", "app_restored"} {
		g.names[n] = n + suffix
	}
	for _, r := range []string{"app_owner", "app_runtime"} {
		g.passwords[g.names[r]] = randomHex(t, 12)
	}
	g.dir, err = os.MkdirTemp("", "atomicphase-production-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(g.dir, 0o755)) // PgBouncer reads it as the postgres user
	t.Cleanup(func() { os.RemoveAll(g.dir) })
	t.Cleanup(func() { g.dropAll(t) }) // after PgBouncer and the console are gone: cleanups run last first
	t.Cleanup(func() {
		for i := len(g.cleanups) - 1; i >= 0; i-- {
			g.cleanups[i]()
		}
	})
	for _, b := range blocks {
		if b.id != "after-restore" {
			continue
		}
		for _, argv := range shellLines(t, b.text) {
			if len(argv) == 4 && argv[0] == "atomicphase" && argv[1] == "inspect" {
				g.seed = [2]string{argv[2], argv[3]}
			}
		}
	}
	require.NotEmpty(t, g.seed[0], "the after-restore block inspects one key, which the startup check leaves in flight")

	for _, b := range blocks {
		c, ok := guideChecks[b.id]
		require.True(t, ok, "docs/production.md:%d: no check for block %q", b.line, b.id)
		if !t.Run(b.id, func(t *testing.T) { c.check(g, t, b) }) {
			t.Fatalf("docs/production.md:%d: block %q failed its check; the blocks after it depend on it", b.line, b.id)
		}
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// dropAll drops the databases and roles the page made.
func (g *guide) dropAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, g.super)
	if err != nil {
		t.Errorf("drop what the guide made: %v", err)
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE strpos(datname, $1) > 0`, g.suffix)
	if err == nil {
		var names []string
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Errorf("drop database %s: %v", n, err)
			}
		}
	}
	if err != nil {
		t.Errorf("list the databases the guide made: %v", err)
	}
	for _, n := range []string{"app_runtime", "app_owner"} {
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{g.names[n]}.Sanitize()); err != nil {
			t.Errorf("drop role %s: %v", g.names[n], err)
		}
	}
}

var guideNames = regexp.MustCompile(`\b(app_owner|app_runtime|app_restored|app)\b`)

// rename writes the page's database and role names as the test's.
func (g *guide) rename(s string) string {
	return guideNames.ReplaceAllStringFunc(s, func(n string) string { return g.names[n] })
}

// rewriteURL points a database URL of the page (its names already
// renamed) at the test's server or PgBouncer, with the role's password.
func (g *guide) rewriteURL(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err, raw)
	require.Equal(t, "postgres", u.Scheme, raw)
	switch u.Host {
	case "db.internal:5432":
		u.Host = net.JoinHostPort(g.super.Host, strconv.Itoa(int(g.super.Port)))
	case "pgbouncer.internal:6432":
		require.NotEmpty(t, g.bouncer, "%s: the PgBouncer the page configures is not running", raw)
		u.Host = g.bouncer
	default:
		t.Fatalf("%s: the page's database URLs reach db.internal:5432 or pgbouncer.internal:6432", raw)
	}
	user := u.User.Username()
	pw, ok := g.passwords[user]
	require.True(t, ok, "%s: the page connects as app_owner or app_runtime", raw)
	u.User = url.UserPassword(user, pw)
	q := u.Query()
	if g.super.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// roleURL is the URL of the page's role in the page's database, straight
// to the server.
func (g *guide) roleURL(t *testing.T, role, database string) string {
	return g.rewriteURL(t, fmt.Sprintf("postgres://%s@db.internal:5432/%s", g.names[role], g.names[database]))
}

// rewriteWord rewrites a shell word: the names, and a database URL in it.
func (g *guide) rewriteWord(t *testing.T, w string) string {
	w = g.rename(w)
	if i := strings.Index(w, "postgres://"); i >= 0 {
		w = w[:i] + g.rewriteURL(t, w[i:])
	}
	return w
}

// shellLines splits a shell block into its commands' words: quotes
// removed, lines continued with a backslash joined, comments dropped.
// Nothing is expanded: a word keeps $(...) as written.
func shellLines(t *testing.T, text string) [][]string {
	t.Helper()
	var out [][]string
	for _, line := range strings.Split(strings.ReplaceAll(text, "\\\n", " "), "\n") {
		var words []string
		var w strings.Builder
		inWord, quote := false, rune(0)
	scan:
		for _, r := range line {
			switch {
			case quote != 0:
				if r == quote {
					quote = 0
				} else {
					w.WriteRune(r)
				}
			case r == '\'' || r == '"':
				quote, inWord = r, true
			case r == '#' && !inWord:
				break scan
			case r == ' ' || r == '\t':
				if inWord {
					words = append(words, w.String())
					w.Reset()
					inWord = false
				}
			default:
				w.WriteRune(r)
				inWord = true
			}
		}
		require.Zero(t, quote, "an unclosed quote in %q", line)
		if inWord {
			words = append(words, w.String())
		}
		if len(words) > 0 {
			out = append(out, words)
		}
	}
	return out
}

// assignment splits NAME=value.
func assignment(w string) (string, string, bool) {
	name, value, ok := strings.Cut(w, "=")
	return name, value, ok && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(name)
}

// secret is the value the test gives a variable the page reads from a
// file or a command.
func (g *guide) secret(t *testing.T, name string) string {
	switch name {
	case "ATOMICPHASE_UI_TOKEN":
		return g.uiToken
	}
	t.Fatalf("the page sets %s from a command the test does not know", name)
	return ""
}

// envValue rewrites an exported value.
func (g *guide) envValue(t *testing.T, name, value string) string {
	if strings.Contains(value, "$") {
		return g.secret(t, name)
	}
	return g.rewriteWord(t, value)
}

// cliRun is one atomicphase line the page runs, and what it did.
type cliRun struct {
	args []string
	res  result
}

// runCLIBlock runs a shell block of export and atomicphase lines through
// the CLI's own entry point, in-process, and requires each to exit 0.
func (g *guide) runCLIBlock(t *testing.T, text string) []cliRun {
	t.Helper()
	runs := g.runCLILines(t, text)
	for _, r := range runs {
		require.Equal(t, 0, r.res.code, "atomicphase %s\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.res.stdout, r.res.stderr)
	}
	return runs
}

// runCLILines is runCLIBlock without its requirement.
func (g *guide) runCLILines(t *testing.T, text string) []cliRun {
	t.Helper()
	var runs []cliRun
	for _, argv := range shellLines(t, text) {
		if argv[0] == "export" {
			g.export(t, argv)
			continue
		}
		env := maps.Clone(g.env)
		for len(argv) > 0 {
			name, value, ok := assignment(argv[0])
			if !ok {
				break
			}
			env[name] = g.envValue(t, name, value)
			argv = argv[1:]
		}
		require.NotEmpty(t, argv)
		require.Equal(t, "atomicphase", argv[0], "a CLI block runs atomicphase and export only: %v", argv)
		args := make([]string, len(argv)-1)
		for i, a := range argv[1:] {
			args[i] = g.rewriteWord(t, a)
		}
		runs = append(runs, cliRun{args: args, res: runCLI(t, env, "", args...)})
	}
	require.NotEmpty(t, runs, "the block runs no atomicphase line")
	return runs
}

// session is a psql-like session of SQL statements over pgx.
type session struct {
	conn *pgx.Conn
	cfg  *pgx.ConnConfig
}

func (g *guide) connect(t *testing.T, cfg *pgx.ConnConfig) *session {
	t.Helper()
	conn, err := pgx.ConnectConfig(g.ctx, cfg)
	require.NoError(t, err, "connect as %s to %s", cfg.User, cfg.Database)
	s := &session{conn: conn, cfg: cfg}
	t.Cleanup(func() { s.conn.Close(context.Background()) })
	return s
}

// superSession connects as the superuser to database (a page's name).
func (g *guide) superSession(t *testing.T, database string) *session {
	cfg := g.super.Copy()
	if database != "postgres" {
		cfg.Database = g.names[database]
	}
	return g.connect(t, cfg)
}

// roleSession connects as the page's role to the page's database,
// straight to the server.
func (g *guide) roleSession(t *testing.T, role, database string) *session {
	cfg, err := pgx.ParseConfig(g.roleURL(t, role, database))
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return g.connect(t, cfg)
}

// run runs an SQL block, its names renamed, statement by statement, with
// psql's \connect and \password; it returns each statement's rows, as
// text.
func (s *session) run(t *testing.T, g *guide, text string) [][][]string {
	t.Helper()
	var out [][][]string
	var stmt strings.Builder
	for _, line := range strings.Split(g.rename(text), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		if strings.HasPrefix(trimmed, `\`) {
			require.Empty(t, strings.TrimSpace(stmt.String()), "a psql command inside a statement: %s", line)
			s.meta(t, g, strings.Fields(trimmed))
			continue
		}
		stmt.WriteString(line + "\n")
		if code, _, _ := strings.Cut(trimmed, " --"); strings.HasSuffix(strings.TrimSpace(code), ";") {
			rows, err := s.conn.Query(g.ctx, stmt.String())
			require.NoError(t, err, stmt.String())
			var got [][]string
			for rows.Next() {
				vals, err := rows.Values()
				require.NoError(t, err)
				row := make([]string, len(vals))
				for i, v := range vals {
					row[i] = fmt.Sprint(v)
				}
				got = append(got, row)
			}
			require.NoError(t, rows.Err(), stmt.String())
			out = append(out, got)
			stmt.Reset()
		}
	}
	require.Empty(t, strings.TrimSpace(stmt.String()), "a statement without its semicolon")
	return out
}

// meta runs the psql commands the page uses.
func (s *session) meta(t *testing.T, g *guide, words []string) {
	t.Helper()
	require.Len(t, words, 2, "%v", words)
	switch words[0] {
	case `\password`:
		pw, ok := g.passwords[words[1]]
		require.True(t, ok, `\password %s: a role the page makes`, words[1])
		_, err := s.conn.Exec(g.ctx, "ALTER ROLE "+pgx.Identifier{words[1]}.Sanitize()+" PASSWORD "+quoteLiteral(pw))
		require.NoError(t, err)
	case `\connect`, `\c`:
		cfg := s.cfg.Copy()
		cfg.Database = words[1]
		require.NoError(t, s.conn.Close(g.ctx))
		conn, err := pgx.ConnectConfig(g.ctx, cfg)
		require.NoError(t, err, `\connect %s`, words[1])
		s.conn, s.cfg = conn, cfg
	default:
		t.Fatalf("the test does not run the psql command %s", words[0])
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// checkSetting requires name to be a server setting and value a valid
// value of it: set in a transaction rolled back when a session may set
// it, else checked against its type and bounds.
func (g *guide) checkSetting(t *testing.T, name, value string) {
	t.Helper()
	s := g.superSession(t, "postgres")
	var level, vartype string
	var minVal, maxVal *string
	var enum []string
	err := s.conn.QueryRow(g.ctx, `SELECT context, vartype, min_val, max_val, enumvals FROM pg_settings WHERE name = $1`, name).
		Scan(&level, &vartype, &minVal, &maxVal, &enum)
	if errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("%s is not a PostgreSQL setting", name)
	}
	require.NoError(t, err)
	if level == "user" || level == "superuser" {
		tx, err := s.conn.Begin(g.ctx)
		require.NoError(t, err)
		defer tx.Rollback(g.ctx)
		_, err = tx.Exec(g.ctx, `SELECT set_config($1, $2, true)`, name, value)
		require.NoError(t, err, "%s = %s", name, value)
		return
	}
	switch vartype {
	case "bool":
		require.Contains(t, []string{"on", "off", "true", "false", "yes", "no", "1", "0"}, strings.ToLower(value), "%s = %s", name, value)
	case "enum":
		require.Contains(t, enum, value, "%s = %s", name, value)
	case "integer", "real":
		v, err := strconv.ParseFloat(value, 64)
		require.NoError(t, err, "%s = %s: a number, without a unit", name, value)
		if vartype == "integer" {
			require.Equal(t, float64(int64(v)), v, "%s = %s: an integer", name, value)
		}
		lo, _ := strconv.ParseFloat(*minVal, 64)
		hi, _ := strconv.ParseFloat(*maxVal, 64)
		require.True(t, v >= lo && v <= hi, "%s = %s: within [%s, %s]", name, value, *minVal, *maxVal)
	}
}

// postmasterSetting reports whether name changes only at a restart.
func (g *guide) postmasterSetting(t *testing.T, name string) bool {
	var level string
	require.NoError(t, g.superSession(t, "postgres").conn.QueryRow(g.ctx, `SELECT context FROM pg_settings WHERE name = $1`, name).Scan(&level))
	return level == "postmaster"
}

func (g *guide) checkPackages(t *testing.T, b guideBlock) {
	g.settings = map[string]string{}
	version, restarted, needRestart, psql := "", false, false, false
	sameCluster := func(v, c string) {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "a version: %s", v)
		require.True(t, n >= 14 && n <= 18, "PostgreSQL %d: the library supports 14 to 18", n)
		require.Equal(t, "main", c, "the cluster the package creates is main")
		if version == "" {
			version = v
		}
		require.Equal(t, version, v, "every line names the same cluster")
	}
	for _, argv := range shellLines(t, b.text) {
		line := strings.Join(argv, " ")
		switch {
		case strings.HasPrefix(line, "sudo apt-get install "):
			require.Contains(t, argv, "-y", line)
			for _, p := range argv[3:] {
				if p != "-y" {
					require.Regexp(t, `^postgresql(-1[4-8])?$`, p, "%s: the server's package", line)
				}
			}
		case line == "pg_lsclusters":
		case strings.HasPrefix(line, "sudo pg_conftool "):
			require.Len(t, argv, 7, "%s: sudo pg_conftool VERSION CLUSTER set NAME VALUE", line)
			sameCluster(argv[2], argv[3])
			require.Equal(t, "set", argv[4], line)
			g.checkSetting(t, argv[5], argv[6])
			g.settings[argv[5]] = argv[6]
			if g.postmasterSetting(t, argv[5]) {
				needRestart, restarted = true, false
			}
		case strings.HasPrefix(line, "sudo pg_ctlcluster "):
			require.Len(t, argv, 5, "%s: sudo pg_ctlcluster VERSION CLUSTER ACTION", line)
			sameCluster(argv[2], argv[3])
			require.Contains(t, []string{"start", "stop", "restart", "reload", "status"}, argv[4], line)
			restarted = restarted || argv[4] == "restart"
		case line == "sudo -u postgres psql":
			psql = true
		default:
			t.Fatalf("the test does not know the command %q", line)
		}
	}
	require.Contains(t, []string{"on", "remote_write", "remote_apply"}, g.settings["synchronous_commit"],
		"synchronous_commit waits for the flush: an acknowledged phase is not lost")
	require.Contains(t, g.settings, "max_connections")
	require.True(t, !needRestart || restarted, "a setting that changes only at a restart is followed by pg_ctlcluster ... restart")
	require.True(t, psql, "the block ends in a superuser's session")
}

func (g *guide) checkContainer(t *testing.T, b guideBlock) {
	volumes := map[string]bool{}
	name := ""
	ran, opened := false, false
	for _, argv := range shellLines(t, b.text) {
		line := strings.Join(argv, " ")
		switch {
		case len(argv) == 4 && argv[0] == "docker" && argv[1] == "volume" && argv[2] == "create":
			volumes[argv[3]] = true
		case len(argv) > 2 && argv[0] == "docker" && argv[1] == "run":
			ran = true
			mounts := map[string]string{} // target: source
			env := map[string]string{}
			restart, image := "", ""
			i := 2
			for ; i < len(argv) && strings.HasPrefix(argv[i], "-"); i++ {
				flag := argv[i]
				if flag == "-d" {
					continue
				}
				require.Less(t, i+1, len(argv), "%s needs a value", flag)
				i++
				v := argv[i]
				switch flag {
				case "--name":
					name = v
				case "--restart":
					restart = v
				case "-v":
					parts := strings.Split(v, ":")
					require.True(t, len(parts) == 2 || len(parts) == 3 && parts[2] == "ro", "-v %s", v)
					mounts[parts[1]] = parts[0]
				case "-p":
					require.Regexp(t, `^([0-9.]+:)?\d+:5432$`, v, "-p publishes the server's port")
				case "-e":
					k, val, ok := strings.Cut(v, "=")
					require.True(t, ok, "-e %s", v)
					env[k] = val
				default:
					t.Fatalf("the test does not know docker run's %s", flag)
				}
			}
			require.Less(t, i, len(argv), "docker run names an image")
			image = argv[i]
			m := regexp.MustCompile(`^postgres:(\d+)(\.\d+)?(-[a-z0-9]+)?$`).FindStringSubmatch(image)
			require.NotNil(t, m, "the official image, by major version: %s", image)
			major, _ := strconv.Atoi(m[1])
			require.True(t, major >= 14 && major <= 18, "%s: the library supports 14 to 18", image)
			data := "/var/lib/postgresql/data"
			if major >= 18 {
				data = "/var/lib/postgresql" // the 18 image keeps its data in /var/lib/postgresql/18/docker
			}
			require.Contains(t, mounts, data, "the data volume is mounted where %s keeps its data", image)
			require.True(t, volumes[mounts[data]], "the data is in a named volume docker volume create made, not %q", mounts[data])
			require.Contains(t, []string{"always", "unless-stopped"}, restart, "a restart policy that starts it again")
			require.NotContains(t, env, "POSTGRES_PASSWORD", "the password stays off the command line")
			require.Contains(t, mounts, env["POSTGRES_PASSWORD_FILE"], "POSTGRES_PASSWORD_FILE names a file mounted into the container")
			settings := map[string]string{}
			for i++; i < len(argv); i += 2 {
				require.Equal(t, "-c", argv[i], "after the image, the server's settings, each -c NAME=VALUE")
				require.Less(t, i+1, len(argv))
				k, v, ok := strings.Cut(argv[i+1], "=")
				require.True(t, ok, "-c %s", argv[i+1])
				g.checkSetting(t, k, v)
				settings[k] = v
			}
			require.Equal(t, g.settings, settings, "the container is given the settings the packages' cluster is")
		case len(argv) >= 3 && argv[0] == "docker" && argv[1] == "exec":
			opened = true
			require.Equal(t, []string{"docker", "exec", "-it", name, "psql", "-U", "postgres"}, argv, "a superuser's session in the container")
		default:
			t.Fatalf("the test does not know the command %q", line)
		}
	}
	require.True(t, ran && opened, "the block runs the container and opens a session in it")
}

func (g *guide) checkRoles(t *testing.T, b guideBlock) {
	g.superSession(t, "postgres").run(t, g, b.text)

	owner := g.roleSession(t, "app_owner", "app")
	var timeout string
	require.NoError(t, owner.conn.QueryRow(g.ctx, `SHOW statement_timeout`).Scan(&timeout))
	require.Equal(t, "0", timeout, "the owner's migrations have no statement timeout")
	runtime := g.roleSession(t, "app_runtime", "app")
	for _, setting := range []string{"statement_timeout", "idle_in_transaction_session_timeout"} {
		var ms int64
		require.NoError(t, runtime.conn.QueryRow(g.ctx, `SELECT setting::bigint * CASE unit WHEN 's' THEN 1000 ELSE 1 END
			FROM pg_settings WHERE name = $1 AND unit IN ('ms', 's')`, setting).Scan(&ms))
		d := time.Duration(ms) * time.Millisecond
		require.True(t, d > 0 && d < atomicphase.DefaultLockTimeout, "the runtime role's %s (%s) is set, below Config.LockTimeout", setting, d)
	}
	var publicConnects, publicCreates bool
	var schemaOwner string
	require.NoError(t, owner.conn.QueryRow(g.ctx, `
		SELECT EXISTS (SELECT FROM pg_database d, aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a
		               WHERE d.datname = current_database() AND a.grantee = 0 AND a.privilege_type = 'CONNECT'),
		       EXISTS (SELECT FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
		               WHERE n.nspname = 'public' AND a.grantee = 0 AND a.privilege_type = 'CREATE'),
		       (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public')`).
		Scan(&publicConnects, &publicCreates, &schemaOwner))
	require.False(t, publicConnects, "PUBLIC may not connect to the database")
	require.False(t, publicCreates, "PUBLIC may not create in schema public")
	require.Equal(t, g.names["app_owner"], schemaOwner, "the owner owns schema public")
}

func (g *guide) checkMigrate(t *testing.T, b guideBlock) {
	runs := g.runCLIBlock(t, b.text)
	require.Contains(t, runs[len(runs)-1].res.stdout, "applied ", "the first migrate applies the migrations")
	require.Equal(t, g.roleURL(t, "app_owner", "app"), g.env["DATABASE_URL"], "the schema is made as the owner")
	pool := g.pool(t, g.roleURL(t, "app_owner", "app"))
	runner, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	require.NoError(t, runner.CheckSchema(g.ctx))
}

// pool opens a pool on url, closed when the test ends.
func (g *guide) pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(g.ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// checkRuntimeGrants requires the runtime role to pass CheckGrants on
// database when want is nil, or to fail it with want; it returns the error.
func (g *guide) checkRuntimeGrants(t *testing.T, database string, want error) error {
	t.Helper()
	runner, err := atomicphase.NewRunner(g.pool(t, g.roleURL(t, "app_runtime", database)), nil)
	require.NoError(t, err)
	err = runner.CheckGrants(g.ctx)
	if want == nil {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, want)
	}
	return err
}

// sqlStatements splits SQL into its statements, each with its blanks
// collapsed.
func sqlStatements(sql string) []string {
	var out []string
	for _, s := range strings.Split(sql, ";") {
		if s = strings.Join(strings.Fields(s), " "); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (g *guide) checkGrants(t *testing.T, b guideBlock) {
	security, err := os.ReadFile(securityGuide)
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)## Database roles\n.*?```sql\n(.*?)```").FindSubmatch(security)
	require.NotNil(t, block, "docs/security-and-limits.md gives the runtime role's grants in a sql block")
	require.Equal(t, sqlStatements(string(block[1])), sqlStatements(b.text),
		"the grants are those docs/security-and-limits.md (Database roles) gives, which TestARuntimeRoleWithTheDocumentedGrantsRunsEverything runs")

	g.checkRuntimeGrants(t, "app", atomicphase.ErrGrantsMissing)
	g.roleSession(t, "app_owner", "app").run(t, g, b.text)
	g.checkRuntimeGrants(t, "app", nil)
	g.grants = b.text
}

// ini parses a PgBouncer configuration: section, key, value, in order.
func parseINI(t *testing.T, text string) [][3]string {
	t.Helper()
	var out [][3]string
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, ";") || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "not key = value: %q", line)
			out = append(out, [3]string{section, strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	return out
}

func (g *guide) checkPgBouncerConfig(t *testing.T, b guideBlock) {
	entries := parseINI(t, b.text)
	mode, databases := "", 0
	for _, e := range entries {
		switch {
		case e[0] == "pgbouncer" && e[1] == "pool_mode":
			mode = e[2]
		case e[0] == "databases":
			databases++
		}
	}
	require.Equal(t, "transaction", mode, "PgBouncer in transaction pooling mode, the one the library is tested in")
	require.Equal(t, 1, databases, "one database")
	g.ini = b.text
}

func (g *guide) checkUserlist(t *testing.T, b guideBlock) {
	if !pgtemp.HaveBouncer() {
		t.Skip("no pgbouncer to check the page's configuration with: apt-get install pgbouncer")
	}
	results := g.superSession(t, "postgres").run(t, g, b.text)
	require.Len(t, results, 1)
	require.Len(t, results[0], 1, "one line: the runtime role's")
	require.Regexp(t, `^"[a-z0-9_]+" "SCRAM-SHA-256\$`, results[0][0][0], "the role's SCRAM secret")
	userlist := filepath.Join(g.dir, "userlist.txt")
	require.NoError(t, os.WriteFile(userlist, []byte(results[0][0][0]+"\n"), 0o644))

	// The page's configuration, pointed at the test's server and files.
	port := freePort(t)
	var ini strings.Builder
	section := ""
	for _, line := range strings.Split(g.ini, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			section = trimmed
			ini.WriteString(line + "\n")
			if section == "[pgbouncer]" {
				ini.WriteString("unix_socket_dir =\n")
			}
			continue
		}
		k, v, ok := strings.Cut(trimmed, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok:
			ini.WriteString(line + "\n")
		case section == "[databases]":
			var conn []string
			for _, kv := range strings.Fields(v) {
				name, val, _ := strings.Cut(kv, "=")
				switch name {
				case "host":
					require.Equal(t, "db.internal", val)
					val = g.super.Host
				case "port":
					require.Equal(t, "5432", val)
					val = strconv.Itoa(int(g.super.Port))
				case "dbname":
					val = g.rename(val)
				}
				conn = append(conn, name+"="+val)
			}
			fmt.Fprintf(&ini, "%s = %s\n", g.rename(k), strings.Join(conn, " "))
		case k == "listen_addr":
			ini.WriteString("listen_addr = 127.0.0.1\n")
		case k == "listen_port":
			require.Equal(t, "6432", v, "the port the page's URLs name")
			fmt.Fprintf(&ini, "listen_port = %d\n", port)
		case k == "auth_file":
			fmt.Fprintf(&ini, "auth_file = %s\n", userlist)
		default:
			ini.WriteString(line + "\n")
		}
	}
	path := filepath.Join(g.dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(path, []byte(ini.String()), 0o644))
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	args := []string{path}
	if os.Geteuid() == 0 {
		args = []string{"-u", "postgres", path} // PgBouncer refuses to run as root
	}
	var log lockedBuffer
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = g.dir, &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// Stopped when the whole test ends, not this subtest.
	g.cleanupLater(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	g.bouncer = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	url := g.rewriteURL(t, "postgres://"+g.names["app_runtime"]+"@pgbouncer.internal:6432/"+g.names["app"])
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(g.ctx, time.Second)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited with the page's configuration:\n%s\n%s", ini.String(), log.String())
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no connection through PgBouncer as the runtime role: %v\n%s", err, log.String())
	}
}

// cleanupLater runs f when TestProductionGuideCommands ends, not when the
// subtest that calls it does.
func (g *guide) cleanupLater(f func()) { g.cleanups = append(g.cleanups, f) }

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (g *guide) checkThroughPgBouncer(t *testing.T, b guideBlock) {
	if g.bouncer == "" {
		g.env["DATABASE_URL"] = g.roleURL(t, "app_runtime", "app") // the blocks after it run as the runtime role
		t.Skip("no PgBouncer running")
	}
	runs := g.runCLIBlock(t, b.text)
	require.Equal(t, "no keys match\n", runs[len(runs)-1].res.stdout)
	require.Contains(t, g.env["DATABASE_URL"], "@"+g.bouncer+"/", "the runtime role's URL goes through PgBouncer")
	require.Contains(t, g.env["DATABASE_URL"], "default_query_exec_mode=exec")

	// Without the exec mode, the CLI refuses to work through PgBouncer.
	u, err := url.Parse(g.env["DATABASE_URL"])
	require.NoError(t, err)
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	res := runCLI(t, map[string]string{"DATABASE_URL": u.String()}, "", runs[len(runs)-1].args...)
	require.NotEqual(t, 0, res.code, "pgx's default exec mode through PgBouncer")
	require.Contains(t, res.stderr, "exec mode")
}

// The Go block of docs/production.md's Start-up is openKeys, byte for
// byte, doc comment included: the compiler checks it, and checkStartup
// runs it.

// openKeys applies this release's expand migrations as the owner, checks
// that the runtime role's pool can run everything, and registers the
// workflows. Run the sweeper it returns in every process that serves them.
// cfg carries the Observer (apotel.New) and the LockTimeout.
func openKeys(ctx context.Context, ownerURL string, pool *pgxpool.Pool, cfg *atomicphase.Config, workflows ...atomicphase.AnyWorkflow) (*atomicphase.Runner, *atomicphase.Sweeper, error) {
	owner, err := pgxpool.New(ctx, ownerURL) // straight to PostgreSQL, not through PgBouncer
	if err != nil {
		return nil, nil, err
	}
	_, err = atomicphase.Migrate(ctx, owner, nil) // expand steps only: the previous release keeps serving
	owner.Close()
	if err != nil {
		return nil, nil, err
	}
	runner, err := atomicphase.NewRunner(pool, cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := runner.CheckSchema(ctx); err != nil { // the schema, and an exec mode PgBouncer can carry
		return nil, nil, err
	}
	if err := runner.CheckGrants(ctx); err != nil { // names each grant the runtime role lacks
		return nil, nil, err
	}
	if err := runner.Register(workflows...); err != nil {
		return nil, nil, err
	}
	sweeper, err := atomicphase.NewSweeper(runner, nil)
	return runner, sweeper, err
}

// funcSource returns the source of a function of this file, its doc
// comment included.
func funcSource(t *testing.T, name string) string {
	t.Helper()
	fset := token.NewFileSet()
	src, err := os.ReadFile("production_doc_test.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(fset, "production_doc_test.go", src, parser.ParseComments)
	require.NoError(t, err)
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name {
			return string(src[fset.Position(fn.Doc.Pos()).Offset:fset.Position(fn.End()).Offset]) + "\n"
		}
	}
	t.Fatalf("no function %s", name)
	return ""
}

func (g *guide) checkStartup(t *testing.T, b guideBlock) {
	require.Equal(t, funcSource(t, "openKeys"), b.text, "the Start-up block is openKeys of cmd/atomicphase/production_doc_test.go, which the compiler checks: change both")
	runtimeURL := g.env["DATABASE_URL"]
	if g.bouncer == "" {
		runtimeURL = g.roleURL(t, "app_runtime", "app")
	}
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	type order struct{ N int }
	start := func(_ struct{}, _ *atomicphase.Request) (order, error) { return order{}, nil }
	wf := atomicphase.MustWorkflow("checkout", start, []atomicphase.Phase[order]{
		atomicphase.Local("charge", func(context.Context, atomicphase.Tx, *order) (atomicphase.Outcome, error) {
			if g.failing.Load() {
				return atomicphase.Outcome{}, errors.New("the payment API did not answer")
			}
			return atomicphase.Respond(201, []byte(`{"ok":true}`)), nil
		})}, nil)
	runner, sweeper, err := openKeys(ctx, g.roleURL(t, "app_owner", "app"), g.pool(t, runtimeURL), &atomicphase.Config{LockTimeout: time.Minute}, wf)
	require.NoError(t, err)
	req := func(scope, key string) atomicphase.Request {
		return atomicphase.Request{Scope: scope, Key: key, Method: "POST", Path: "/checkout"}
	}
	resp, err := runner.Run(ctx, wf, req("tenant-1", "order-1"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	resp, err = runner.Run(ctx, wf, req("tenant-1", "order-1"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	// The key the page inspects after its restore: left in flight.
	g.failing.Store(true)
	_, err = runner.Run(ctx, wf, req(g.seed[0], g.seed[1]))
	require.Error(t, err)
	_, err = sweeper.RunOnce(ctx)
	require.NoError(t, err)
	info, err := runner.Inspect(ctx, g.seed[0], g.seed[1])
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status)
}

func (g *guide) checkSweep(t *testing.T, b guideBlock) {
	runs := g.runCLIBlock(t, b.text)
	for _, r := range runs {
		if slices.Contains(r.args, "--json") {
			require.True(t, json.Valid([]byte(r.res.stdout)), "sweep --json prints JSON: %s", r.res.stdout)
		}
	}
	u, err := url.Parse(g.env["DATABASE_URL"])
	require.NoError(t, err)
	require.Equal(t, g.names["app_runtime"], u.User.Username(), "the sweep runs as the runtime role")
}

func (g *guide) checkConsole(t *testing.T, b guideBlock) {
	var args []string
	for _, argv := range shellLines(t, b.text) {
		if argv[0] == "export" {
			g.export(t, argv)
			continue
		}
		require.Equal(t, []string{"atomicphase", "ui"}, argv[:2], "the block serves the console")
		args = argv[1:]
	}
	require.NotNil(t, args)
	require.GreaterOrEqual(t, len(g.env["ATOMICPHASE_UI_TOKEN"]), 16)
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--listen":
			g.uiListen = args[i+1]
			args[i+1] = "127.0.0.1:0"
		case "--allowed-host":
			g.uiHosts = append(g.uiHosts, args[i+1])
		}
	}
	require.NotEmpty(t, g.uiListen)
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr lockedBuffer
	env := maps.Clone(g.env)
	c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return env[k] }}
	done := make(chan int, 1)
	go func() { done <- c.run(ctx, args) }()
	g.uiStop = func() (int, string) { cancel(); return <-done, stderr.String() }
	g.cleanupLater(func() { cancel() })
	addr := regexp.MustCompile(`console at (http://\S+/)`)
	for g.uiBase == "" {
		if m := addr.FindStringSubmatch(stdout.String()); m != nil {
			g.uiBase = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("atomicphase ui exited with %d: %s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// export applies an export line to the environment of the lines after it.
func (g *guide) export(t *testing.T, argv []string) {
	for _, a := range argv[1:] {
		name, value, ok := assignment(a)
		require.True(t, ok, "export %q", a)
		g.env[name] = g.envValue(t, name, value)
	}
}

func (g *guide) checkProxy(t *testing.T, b guideBlock) {
	require.NotEmpty(t, g.uiBase, "the console block runs first")
	require.NotContains(t, b.text, "no-referrer", "the proxy keeps the console's Referrer-Policy")
	require.NotContains(t, b.text, "Referrer-Policy", "the proxy keeps the console's Referrer-Policy")
	directives := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*([a-z_]+)\s+([^;{}\n]*);`).FindAllStringSubmatch(b.text, -1) {
		directives[m[1]] = append(directives[m[1]], strings.Join(strings.Fields(m[2]), " "))
	}
	require.Equal(t, []string{"http://" + g.uiListen}, directives["proxy_pass"], "the proxy passes to the console's --listen address")
	require.Contains(t, directives["proxy_set_header"], "Host $host", "the proxy passes the Host through")
	require.Len(t, directives["server_name"], 1)
	host := directives["server_name"][0]
	require.Contains(t, g.uiHosts, host, "the console is told the proxy's name with --allowed-host")

	send := func(method, host, origin, path, token string) int {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"scope":"nobody","key":"nothing"}`)
		}
		req, err := http.NewRequest(method, g.uiBase+path, body)
		require.NoError(t, err)
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	token := g.env["ATOMICPHASE_UI_TOKEN"]
	require.Equal(t, http.StatusOK, send("GET", host, "", "", token), "the proxy's name, with the token")
	require.Equal(t, http.StatusUnauthorized, send("GET", host, "", "", ""), "without the token")
	require.Equal(t, http.StatusMisdirectedRequest, send("GET", "rebound.example", "", "", token), "another name")
	require.Equal(t, http.StatusNotFound, send("POST", host, "https://"+host, "api/key/unpark", token), "an action from the proxy's origin reaches the console")
	require.Equal(t, http.StatusForbidden, send("POST", host, "https://rebound.example", "api/key/unpark", token), "an action from another origin")
	code, stderr := g.uiStop()
	require.Equal(t, 0, code, stderr)
}

func (g *guide) checkDatabaseAlerts(t *testing.T, b guideBlock) {
	results := g.superSession(t, "app").run(t, g, b.text)
	require.Len(t, results, 2)
	for _, r := range results {
		require.Len(t, r, 1, "one row")
	}
}

// pgTool returns the server's pg_dump or pg_restore: from the directory the
// test server's binaries came from, else PATH; the test skips without one at
// least as new as the server.
func (g *guide) pgTool(t *testing.T, name string) string {
	t.Helper()
	var candidates []string
	if dir, err := pgtemp.FindBinaries(); err == nil {
		candidates = append(candidates, filepath.Join(dir, name))
	}
	if p, err := exec.LookPath(name); err == nil {
		candidates = append(candidates, p)
	}
	var server int
	require.NoError(t, g.superSession(t, "postgres").conn.QueryRow(g.ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&server))
	for _, c := range candidates {
		out, err := exec.Command(c, "--version").Output()
		if err != nil {
			continue
		}
		m := regexp.MustCompile(`(\d+)\.`).FindSubmatch(out)
		if m == nil {
			continue
		}
		if v, _ := strconv.Atoi(string(m[1])); v >= server {
			return c
		}
	}
	t.Skipf("no %s of PostgreSQL %d or later to run the page's line with", name, server)
	return ""
}

// runTool runs a block's one line of pg_dump or pg_restore in the test's
// directory.
func (g *guide) runTool(t *testing.T, b guideBlock, name string) {
	lines := shellLines(t, b.text)
	require.Len(t, lines, 1)
	require.Equal(t, name, lines[0][0])
	args := make([]string, len(lines[0])-1)
	for i, a := range lines[0][1:] {
		args[i] = g.rewriteWord(t, a)
	}
	cmd := exec.Command(g.pgTool(t, name), args...)
	cmd.Dir = g.dir
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(lines[0], " "), out)
}

func (g *guide) checkBackup(t *testing.T, b guideBlock) {
	require.Contains(t, b.text, "--format=custom", "a dump pg_restore reads")
	g.runTool(t, b, "pg_dump")
	g.dumped = true
}

func (g *guide) checkRestoreDatabase(t *testing.T, b guideBlock) {
	g.superSession(t, "postgres").run(t, g, b.text)
}

func (g *guide) checkRestore(t *testing.T, b guideBlock) {
	if !g.dumped {
		t.Skip("no dump to restore")
	}
	g.runTool(t, b, "pg_restore")
	g.restored = true
	g.checkRuntimeGrants(t, "app_restored", nil)
}

func (g *guide) checkAfterRestore(t *testing.T, b guideBlock) {
	if !g.restored {
		t.Skip("no restored database")
	}
	runs := g.runCLIBlock(t, b.text)
	require.Equal(t, g.roleURL(t, "app_owner", "app_restored"), g.env["DATABASE_URL"])
	abandoned, inspected := false, false
	for _, r := range runs {
		switch {
		case slices.Equal(r.args, []string{"keys", "--status", "abandoned"}):
			abandoned = true
			require.Contains(t, r.res.stdout, g.seed[1], "the key in flight at the backup is listed")
		case len(r.args) > 0 && r.args[0] == "inspect":
			inspected = true
			require.Contains(t, r.res.stdout, g.seed[1])
			require.Contains(t, r.res.stdout, "abandoned")
		}
	}
	require.True(t, abandoned && inspected, "the block lists the abandoned keys and inspects one")
}

// previousDeployment makes a database as release 0.2.0 left it, with the
// page's roles and rights: schema 015, the grants 0.2.0's runtime role
// needed, and a 0.2.0 process that announced its workflow version two
// hours ago (0.2.0 sets seen_at alone). The page's name app stands for it
// from then on.
func (g *guide) previousDeployment(t *testing.T) {
	t.Helper()
	name := g.names["app"] + "_v020"
	owner, runtime := pgx.Identifier{g.names["app_owner"]}.Sanitize(), pgx.Identifier{g.names["app_runtime"]}.Sanitize()
	super := g.superSession(t, "postgres")
	for _, stmt := range []string{
		"CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " OWNER " + owner,
		"REVOKE ALL ON DATABASE " + pgx.Identifier{name}.Sanitize() + " FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + pgx.Identifier{name}.Sanitize() + " TO " + runtime,
	} {
		_, err := super.conn.Exec(g.ctx, stmt)
		require.NoError(t, err, stmt)
	}
	g.names["app"] = name
	for _, stmt := range []string{"REVOKE CREATE ON SCHEMA public FROM PUBLIC", "ALTER SCHEMA public OWNER TO " + owner} {
		_, err := g.superSession(t, "app").conn.Exec(g.ctx, stmt)
		require.NoError(t, err, stmt)
	}
	_, err := atomicphase.Migrate(g.ctx, g.pool(t, g.roleURL(t, "app_owner", "app")), &atomicphase.MigrateOpts{TargetVersion: 15})
	require.NoError(t, err)
	ownerSession := g.roleSession(t, "app_owner", "app")
	for _, stmt := range []string{
		"GRANT USAGE ON SCHEMA public TO " + runtime,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO " + runtime,
		"GRANT SELECT, INSERT, DELETE ON atomicphase_audit TO " + runtime,
		"GRANT SELECT, INSERT, UPDATE ON atomicphase_workflow_versions TO " + runtime,
	} {
		_, err := ownerSession.conn.Exec(g.ctx, stmt)
		require.NoError(t, err, stmt)
	}
	_, err = g.roleSession(t, "app_runtime", "app").conn.Exec(g.ctx, `INSERT INTO atomicphase_workflow_versions
		(workflow, version, shape, phases, seen_at) VALUES ('checkout', 'v020', 's', '{charge}', now() - interval '2 hours')`)
	require.NoError(t, err)
}

// pending returns how many migrations the page's database app lacks,
// contract steps included.
func (g *guide) pending(t *testing.T) int {
	t.Helper()
	pending, err := atomicphase.PendingMigrations(g.ctx, g.pool(t, g.roleURL(t, "app_owner", "app")), nil)
	require.NoError(t, err)
	return len(pending)
}

func (g *guide) checkUpgradeExpand(t *testing.T, b guideBlock) {
	g.previousDeployment(t)
	runs := g.runCLIBlock(t, b.text)
	require.Equal(t, g.roleURL(t, "app_owner", "app"), g.env["DATABASE_URL"], "the owner migrates")
	last := runs[len(runs)-1]
	require.Equal(t, []string{"migrate"}, last.args)
	require.Contains(t, last.res.stdout, "applied ")
	require.Contains(t, last.res.stdout, "contract step", "migrate names the contract step it left")
	require.Equal(t, 1, g.pending(t), "the contract step is left")
	again := runCLI(t, g.env, "", last.args...)
	require.Equal(t, 0, again.code, again.stderr)
	require.Contains(t, again.stdout, "up to date")

	// Step 3: the expand steps gave the role that ran 0.2.0 what 0.3.0
	// writes besides (the tables the step names), so it passes CheckGrants
	// already; the grants block, run again, changes nothing.
	doc, _ := readGuide(t)
	step := regexp.MustCompile(`(?s)\n3\. \*\*Check the grants\.\*\*(.*?)\n4\. `).FindStringSubmatch(doc)
	require.NotNil(t, step, "Upgrading has a step 3, Check the grants")
	named := regexp.MustCompile("`(atomicphase_[a-z_]+)`").FindAllStringSubmatch(step[1], -1)
	require.NotEmpty(t, named)
	for _, n := range named {
		var granted bool
		require.NoError(t, g.roleSession(t, "app_runtime", "app").conn.QueryRow(g.ctx,
			`SELECT has_table_privilege($1, 'SELECT, INSERT, UPDATE')`, n[1]).Scan(&granted))
		require.True(t, granted, "the expand steps granted %s to the role that ran 0.2.0", n[1])
	}
	g.checkRuntimeGrants(t, "app", nil)
	g.roleSession(t, "app_owner", "app").run(t, g, g.grants)
	g.checkRuntimeGrants(t, "app", nil)
}

func (g *guide) checkUpgradeWatch(t *testing.T, b guideBlock) {
	runs := g.runCLIBlock(t, b.text)
	require.Contains(t, runs[len(runs)-1].res.stdout, "v020", "the 0.2.0 process's version is listed")
}

func (g *guide) checkUpgradeContract(t *testing.T, b guideBlock) {
	lines := strings.Split(strings.TrimSpace(b.text), "\n")
	require.Len(t, lines, 2, "two lines: the contract, then with a shorter window")
	first := g.runCLILines(t, lines[0])[0]
	require.Equal(t, exitFailure, first.res.code, "a 0.2.0 process was seen 2 hours ago: %s", first.res.stdout)
	require.Contains(t, first.res.stderr, "older release")
	require.Equal(t, 1, g.pending(t), "a refused contract step changes nothing")
	second := g.runCLILines(t, lines[1])[0]
	require.Equal(t, 0, second.res.code, second.res.stderr)
	require.Contains(t, second.res.stdout, "applied ")
	require.Equal(t, 0, g.pending(t), "the contract step is applied")
}
