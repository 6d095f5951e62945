package app

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// TestMigrateIsIdempotentUnderConcurrentStartUps: processes starting
// together against a fresh database all migrate it, River's schema
// included, and a restart finds nothing left to do.
func TestMigrateIsIdempotentUnderConcurrentStartUps(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = Migrate(context.Background(), db.Pool) }()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, Migrate(context.Background(), db.Pool))

	var users, newest int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM users").Scan(&users))
	require.Equal(t, 2, users)
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT max(version) FROM river_migration").Scan(&newest))
	require.Equal(t, fmt.Sprintf("rocketrides-v4-river%03d", newest), SchemaID())
}
