package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// startCluster initialises a cluster in a new temporary directory and
// starts it on a free loopback port, tuned for throwaway use unless
// opts.Durable (no fsync: nothing here must survive an OS crash, only a
// process crash, which PostgreSQL handles alike).
func startCluster(ctx context.Context, bin string, opts *Options) (*Server, error) {
	base := tempBase()
	if opts.Durable {
		base = os.TempDir() // a disk, where fsync is real work
	}
	dir, err := os.MkdirTemp(base, "atomicphase-pg-")
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initArgs := []string{"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-instructions"}
	if !opts.Durable {
		initArgs = append(initArgs, "--no-sync")
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), initArgs...)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, bytes.TrimSpace(out))
	}

	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding it
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		srv, err := runPostgres(ctx, bin, dir, data, port, cred, serverSettings(opts), opts.Cores)
		if err == nil {
			return srv, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// serverSettings are the -c settings of a server started with opts: the
// test settings (durability off) or durable ones, then opts.Settings.
func serverSettings(opts *Options) []string {
	durability := []string{"fsync=off", "synchronous_commit=off", "full_page_writes=off"}
	if opts.Durable {
		durability = []string{"fsync=on", "synchronous_commit=on", "full_page_writes=on"}
	}
	settings := append([]string{"listen_addresses=127.0.0.1", "unix_socket_directories="}, durability...)
	settings = append(settings, "max_connections=300", "shared_buffers=128MB")
	return append(settings, opts.Settings...)
}

func runPostgres(ctx context.Context, bin, dir, data string, port int, cred *syscall.Credential, settings []string, cores string) (*Server, error) {
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if cred != nil {
		_ = os.Chown(logPath, int(cred.Uid), int(cred.Gid))
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port)}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	if cores != "" {
		// taskset sets the affinity and executes postgres in its own
		// process: the pid is the postmaster's, and every backend inherits it.
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			return nil, fmt.Errorf("server cores %q: %w", cores, err)
		}
		cmd = exec.Command(taskset, append([]string{"-c", cores, filepath.Join(bin, "postgres")}, args...)...)
	}
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C aimed at the tests must not stop
	// the server before the tests have cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	watchdog := startWatchdog(cmd.Process.Pid, "QUIT", dir)

	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if watchdog != nil {
			_ = watchdog.Process.Kill()
			_, _ = watchdog.Process.Wait()
		}
		return os.RemoveAll(dir)
	}

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, url)
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return &Server{URL: url, Bin: bin, dir: dir, stop: stop}, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			_ = stop()
			return nil, fmt.Errorf("postgres exited: %s", tail(log, 800))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log, _ := os.ReadFile(logPath)
			_ = stop()
			return nil, fmt.Errorf("postgres did not accept connections: %v: %s", err, tail(log, 800))
		}
	}
}

// serverCredential returns the identity to run the server as: the postgres
// OS user when running as root (PostgreSQL refuses to run as root), else
// nil for the current user. It hands dir to that user.
func serverCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root, and there is no postgres OS user to run the server as (PostgreSQL refuses to run as root)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// tempBase prefers a memory-backed directory for the throwaway cluster:
// cloning a database there takes ~20ms instead of ~300ms on a disk, and
// nothing in it must survive a reboot.
func tempBase() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && st.Bavail*uint64(st.Bsize) >= 1<<30 {
		if f, err := os.CreateTemp("/dev/shm", "atomicphase-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
