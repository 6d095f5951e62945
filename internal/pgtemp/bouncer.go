package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/connstr"
)

// ErrNoPgBouncer is wrapped by StartBouncer's error when there is no
// pgbouncer binary.
var ErrNoPgBouncer = errors.New("no pgbouncer on PATH or in /usr/sbin (Debian/Ubuntu: apt-get install pgbouncer)")

// BouncerPoolSize is how many server connections the PgBouncer StartBouncer
// starts opens per database: fewer than a test pool's connections, so
// concurrent transactions really share server connections.
const BouncerPoolSize = 4

// Bouncer is a running throwaway PgBouncer in transaction pooling mode.
type Bouncer struct {
	// URL connects through it to the postgres database. Any other database
	// on the server is reached by changing the database name.
	URL string
	// Bin is the pgbouncer binary it was started from.
	Bin string

	dir  string
	stop func() error
}

// StartBouncer starts a PgBouncer in transaction pooling mode in front of
// the server serverURL points at, on a free loopback port, with its
// configuration and log in a new temporary directory. Every database name
// is passed through (a wildcard [databases] entry), and every client is let
// in whatever its user name and logs in to the server as serverURL's user
// (auth_type any): it is for tests on loopback only. When the process is
// root it runs as the postgres OS user (PgBouncer refuses to run as root).
// The error wraps ErrNoPgBouncer when the binary is absent. ctx bounds the
// start-up only; PgBouncer runs until Stop or the end of the process, when a
// watchdog stops it.
func StartBouncer(ctx context.Context, serverURL string) (*Bouncer, error) {
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	cfg, err := connstr.Parse(serverURL) // its error quotes no part of the string
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: parse the server's URL %s: %w", connstr.Display(serverURL), err)
	}
	target := &cfg.ConnConfig.Config
	dir, err := os.MkdirTemp(tempBase(), "atomicphase-pgbouncer-")
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding it
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		b, err := runBouncer(ctx, bin, dir, bouncerConfig(target, dir, port), port, cred)
		if err == nil {
			return b, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// Stop shuts PgBouncer down and removes its directory. Stopping a nil or
// stopped Bouncer does nothing.
func (b *Bouncer) Stop() error {
	if b == nil || b.stop == nil {
		return nil
	}
	stop := b.stop
	b.stop = nil
	return stop()
}

// HaveBouncer reports whether a pgbouncer binary is installed.
func HaveBouncer() bool {
	_, err := findBouncer()
	return err == nil
}

func findBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNoPgBouncer
}

// bouncerConfig writes pgbouncer.ini's text. server_reset_query is left
// out: transaction pooling does not run it.
func bouncerConfig(target *pgconn.Config, dir string, port int) string {
	conn := fmt.Sprintf("host=%s port=%d user=%s", connValue(target.Host), target.Port, connValue(target.User))
	if target.Password != "" {
		conn += " password=" + connValue(target.Password)
	}
	return strings.Join([]string{
		"[databases]",
		"* = " + conn,
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = any",
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(BouncerPoolSize),
		"max_client_conn = 1000",
		"ignore_startup_parameters = extra_float_digits",
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"",
	}, "\n")
}

// connValue quotes a value for a libpq-style connection string.
func connValue(s string) string {
	if s != "" && !strings.ContainsAny(s, ` '\`) {
		return s
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func runBouncer(ctx context.Context, bin, dir, config string, port int, cred *syscall.Credential) (*Bouncer, error) {
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(config), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if cred != nil {
		_ = os.Chown(logPath, int(cred.Uid), int(cred.Gid))
	}
	// Not daemonised (no -d): it logs to stderr and stays this process's
	// child, so Stop can wait for it.
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{}) // closed when it has exited
	go func() { _ = cmd.Wait(); close(exited) }()
	watchdog := startWatchdog(cmd.Process.Pid, "TERM", dir)

	halt := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if watchdog != nil {
			_ = watchdog.Process.Kill()
			_, _ = watchdog.Process.Wait()
		}
	}

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	probe, err := pgx.ParseConfig(url)
	if err != nil {
		halt()
		return nil, err
	}
	probe.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	deadline := time.Now().Add(15 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.ConnectConfig(cctx, probe)
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			stop := func() error { halt(); return os.RemoveAll(dir) }
			return &Bouncer{URL: url, Bin: bin, dir: dir, stop: stop}, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			halt()
			return nil, fmt.Errorf("pgbouncer exited: %s", tail(log, 800))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log, _ := os.ReadFile(logPath)
			halt()
			return nil, fmt.Errorf("pgbouncer did not pass connections through: %v: %s", err, tail(log, 800))
		}
	}
}
