package atomicphasetest

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// ExecModeEnv is the environment variable that chooses the pgx query exec
// mode of every database NewDB and Open hand out: one of cache_statement
// (pgx's default), cache_describe, describe_exec, exec or simple_protocol.
// It is written into DB.URL as pgx's default_query_exec_mode parameter, so
// DB.Pool, a second pool parsed from DB.URL and a child process given DB.URL
// all use it. Unset or empty means pgx's default.
const ExecModeEnv = "ATOMICPHASE_TEST_EXEC_MODE"

// execModes are the values pgx's default_query_exec_mode accepts.
var execModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// execModeFromEnv returns the mode ExecModeEnv asks for, "" for none.
func execModeFromEnv() (string, error) {
	mode := strings.TrimSpace(os.Getenv(ExecModeEnv))
	if mode == "" || slices.Contains(execModes, mode) {
		return mode, nil
	}
	return "", fmt.Errorf("atomicphasetest: %s=%q: use one of %s, or leave it unset for pgx's default",
		ExecModeEnv, mode, strings.Join(execModes, ", "))
}

// withExecMode adds pgx's default_query_exec_mode parameter to a
// connection string in URL or keyword/value form.
func withExecMode(url, mode string) string {
	if mode == "" {
		return url
	}
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		return url + sep + "default_query_exec_mode=" + mode
	}
	return strings.TrimSpace(url + " default_query_exec_mode=" + mode)
}
