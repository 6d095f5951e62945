package pgtemp

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestKilledProcessLeavesNothingBehind starts a server (and a PgBouncer,
// when installed) in a child process, SIGKILLs the child, and checks the
// watchdogs stop them and remove their directories.
func TestKilledProcessLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	needBinaries(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	fields := strings.Fields(line)
	require.True(t, len(fields) == 2 || len(fields) == 4, line)
	for i := 0; i < len(fields); i += 2 {
		require.DirExists(t, fields[i+1])
	}

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	for i := 0; i < len(fields); i += 2 {
		url, dir := fields[i], fields[i+1]
		cfg, err := pgx.ParseConfig(url)
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		require.Eventually(t, func() bool {
			_, statErr := os.Stat(dir)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			conn, connErr := pgx.ConnectConfig(ctx, cfg)
			if connErr == nil {
				_ = conn.Close(ctx)
			}
			return errors.Is(statErr, os.ErrNotExist) && connErr != nil
		}, 20*time.Second, 200*time.Millisecond, "%s still up or %s still there", url, dir)
	}
}
