package atomicphasetest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// containerLifetime caps how long a container outlives a test binary that
// died before it could purge it.
const containerLifetime = 30 * 60 // seconds

// startDocker runs postgres in a container when a Docker engine answers.
func startDocker(ctx context.Context) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres",
		Tag:        "15-alpine",
		Env:        []string{"POSTGRES_PASSWORD=postgres", "POSTGRES_HOST_AUTH_METHOD=trust"},
		Cmd: []string{"postgres", "-c", "fsync=off", "-c", "synchronous_commit=off",
			"-c", "full_page_writes=off", "-c", "max_connections=300"},
		Labels: map[string]string{"org.atomicphase.atomicphasetest": "true"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("run postgres container: %w", err)
	}
	_ = res.Expire(containerLifetime)
	url := fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp"))
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, url)
		if err != nil {
			return err
		}
		return conn.Close(cctx)
	}); err != nil {
		_ = pool.Purge(res)
		return nil, fmt.Errorf("postgres container did not accept connections: %w", err)
	}
	return &Server{URL: url, Kind: "docker", stop: func() error { return pool.Purge(res) }}, nil
}
