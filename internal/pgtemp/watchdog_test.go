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

// TestKilledProcessLeavesNothingBehind starts a server in a child process,
// SIGKILLs the child, and checks the watchdog stops the server and removes
// its directory.
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
	url, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
	require.True(t, ok, line)
	require.DirExists(t, dir)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	require.Eventually(t, func() bool {
		_, statErr := os.Stat(dir)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, connErr := pgx.Connect(ctx, url)
		if connErr == nil {
			_ = conn.Close(ctx)
		}
		return errors.Is(statErr, os.ErrNotExist) && connErr != nil
	}, 20*time.Second, 200*time.Millisecond, "server still up or %s still there", dir)
}
