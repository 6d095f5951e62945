package pgtemp

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// startWatchdog starts a detached shell that, once this process is gone
// (exited, panicked or killed), stops the server (with signal, then SIGKILL
// after five seconds) and removes its directory. A SIGKILL gives the
// process no chance to clean up itself; without the watchdog every killed
// test binary would leave a running server behind. signal is a kill(1)
// name: QUIT is PostgreSQL's immediate shutdown, TERM PgBouncer's.
func startWatchdog(pid int, signal, dir string) *exec.Cmd {
	script := `while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
kill -"$4" "$2" 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$2" 2>/dev/null || break; sleep 0.5; done
kill -KILL "$2" 2>/dev/null
rm -rf "$3"`
	cmd := exec.Command("/bin/sh", "-c", script, "atomicphase-pg-watchdog",
		strconv.Itoa(os.Getpid()), strconv.Itoa(pid), dir, signal)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil // cleanup then relies on Stop alone
	}
	return cmd
}
