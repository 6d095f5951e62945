package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/atomicphase/atomicphase/internal/connstr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtemp"
)

// serverSettings are the settings bench-compare starts its own server with,
// beyond pgtemp's durable ones (fsync, synchronous_commit and
// full_page_writes on): no checkpoint is due during a run (a timed one
// would land in one design's measurement and not the others'; the run
// takes a checkpoint of its own before measuring instead), and room for
// every design's pool.
func serverSettings(maxConns int, pgss bool) []string {
	s := []string{
		"checkpoint_timeout=30min",
		"max_wal_size=4GB",
		fmt.Sprintf("max_connections=%d", max(100, maxConns+20)),
	}
	if pgss {
		s = append(s, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=top")
	}
	return s
}

// database is the bench's database, created for the run and dropped after.
type database struct {
	config *pgxpool.Config // connects to it; the designs' pools copy it
	admin  *pgxpool.Pool
	drop   func()
}

// openServer returns the URL of the server to measure on: DATABASE_URL's
// when set, else a durable throwaway server of bench-compare's own, whose
// CPU time cpu then reads (nil for DATABASE_URL's).
func openServer(ctx context.Context, out io.Writer, maxConns int, pgss bool, cores string) (url string, cpu func() time.Duration, stop func(), err error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		fmt.Fprintf(out, "WARNING: DATABASE_URL is set: measuring on %s with the server's own settings (below),\n"+
			"         not the durable settings bench-compare starts its own server with.\n", connstr.Display(u))
		if cores != "" {
			return "", nil, nil, errors.New("-server-cores applies to the server bench-compare starts, and DATABASE_URL is set")
		}
		return u, nil, func() {}, nil
	}
	srv, err := pgtemp.StartWith(ctx, &pgtemp.Options{Durable: true, Settings: serverSettings(maxConns, pgss), Cores: cores})
	if err != nil {
		return "", nil, nil, fmt.Errorf("start PostgreSQL: %w (or set DATABASE_URL)", err)
	}
	fmt.Fprintf(out, "server: a throwaway PostgreSQL from %s, data directory %s (%s)\n", srv.Bin, srv.DataDir(), fsType(srv.DataDir()))
	if cores != "" {
		fmt.Fprintf(out, "server: on CPUs %s\n", cores)
	}
	if pid, err := postmasterPID(srv.DataDir()); err == nil {
		if _, ok := serverCPU(pid); ok {
			cpu = func() time.Duration { d, _ := serverCPU(pid); return d }
		}
	}
	return srv.URL, cpu, func() { _ = srv.Stop() }, nil
}

// postmasterPID reads the server's process id from its data directory.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// serverCPU sums the CPU time (/proc/PID/schedstat, in nanoseconds) of the
// postmaster pid and of its children: the backends and the background
// processes. A child that exits is no longer counted, so a difference of
// two readings misses what such a process (an autovacuum worker, say) did
// before it exited. ok is false when /proc cannot tell.
func serverCPU(pid int) (total time.Duration, ok bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p != pid {
			stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			// pid (comm) state ppid …; comm may hold spaces and parentheses.
			i := strings.LastIndexByte(string(stat), ')')
			f := strings.Fields(string(stat[i+1:]))
			if len(f) < 2 || f[1] != strconv.Itoa(pid) {
				continue
			}
		}
		sched, err := os.ReadFile("/proc/" + e.Name() + "/schedstat")
		if err != nil {
			if p == pid {
				return 0, false
			}
			continue
		}
		f := strings.Fields(string(sched))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		total += time.Duration(ns)
		if p == pid {
			ok = true
		}
	}
	return total, ok
}

// fsType names the file system holding dir, and warns of one in memory,
// where fsync costs nothing.
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "file system unknown"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs: WARNING, in memory, fsync costs nothing here; set TMPDIR to a disk"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return fmt.Sprintf("file system 0x%x", st.Type)
}

// createDatabase creates a database of the run's own on the server at url,
// with the atomicphase schema (atomicphase.Migrate) and the bench's tables,
// and pg_stat_statements when pgss.
func createDatabase(ctx context.Context, url string, pgss bool) (*database, error) {
	// Parsed here, so that no error quotes the string: pgx's parse error
	// does, and masks a password only where it recognises one.
	ccfg, err := connstr.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("the connection string %s: %w", connstr.Display(url), err)
	}
	conn, err := pgx.ConnectConfig(ctx, ccfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", connstr.Display(url), err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("atomicphase_bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("create the bench's database (the role needs CREATEDB): %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(dctx, url); err == nil {
			_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(dctx)
		}
	}
	cfg, err := connstr.Parse(url)
	if err != nil {
		drop()
		return nil, err
	}
	cfg.ConnConfig.Database = name
	adminCfg := cfg.Copy()
	adminCfg.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		drop()
		return nil, err
	}
	db := &database{config: cfg, admin: admin, drop: func() { admin.Close(); drop() }}
	// A throwaway server no other role connects to.
	if _, err := atomicphase.Migrate(ctx, admin, &atomicphase.MigrateOpts{AllowPublicCreate: true}); err != nil {
		db.drop()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := admin.Exec(ctx, schema); err != nil {
		db.drop()
		return nil, fmt.Errorf("create the bench's tables: %w", err)
	}
	if pgss {
		// The view answers only when the server loaded the library.
		_, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
		if err == nil {
			_, err = admin.Exec(ctx, "SELECT count(*) FROM pg_stat_statements")
		}
		if err != nil {
			db.drop()
			return nil, fmt.Errorf("-pgss: %w", err)
		}
	}
	return db, nil
}

// serverInfo is what the report says about the server.
type serverInfo struct {
	version  string
	settings []string // name=value
}

// reportedSettings are the server settings the report gives.
var reportedSettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
	"shared_buffers", "max_wal_size", "checkpoint_timeout", "max_connections", "shared_preload_libraries"}

// readServerInfo reads the server's version and reportedSettings.
func readServerInfo(ctx context.Context, pool *pgxpool.Pool) (serverInfo, error) {
	var info serverInfo
	if err := pool.QueryRow(ctx, "SELECT version()").Scan(&info.version); err != nil {
		return info, err
	}
	for _, name := range reportedSettings {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1, true)", name).Scan(&v); err != nil {
			return info, err
		}
		info.settings = append(info.settings, name+"="+v)
	}
	return info, nil
}

// cpuModel reads the CPU's model name from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
