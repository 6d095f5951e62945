package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The sweep: what keeps keys from being stranded or kept forever without a
// client. It completes abandoned keys (a client that gave up after a crash
// or a failure leaves its request half done: the ride exists, the card may
// be charged) and reaps finished keys past their retention. Every process
// may run one: acquisition decides who runs a key, as it does between
// clients, so no leader is elected.

// Defaults of SweepConfig.
const (
	DefaultSweepInterval  = 5 * time.Second
	DefaultSweepBatch     = 50
	DefaultKeyRetention   = 24 * time.Hour
	DefaultReapBatch      = 1000
	DefaultMaxReapBatches = 100
	DefaultSweepWorkers   = 4
	DefaultMaxPerScope    = 5
	// DefaultParkedRetention is SweepConfig.ParkedRetention's default.
	DefaultParkedRetention = 7 * 24 * time.Hour
	// DefaultAuditRetention is SweepConfig.AuditRetention's default.
	DefaultAuditRetention = 400 * 24 * time.Hour
)

// auditReapEvery is how often a Sweeper reaps the audit trail: seldom,
// since the trail has no index on its time.
const auditReapEvery = time.Hour

// SweepConfig configures a Sweeper. A nil *SweepConfig means all defaults.
type SweepConfig struct {
	// Interval is the time between two sweeps, jittered by up to a fifth
	// either way so that processes started together drift apart. Defaults
	// to 5s.
	Interval time.Duration

	// BatchSize is the most abandoned keys one sweep resumes. Defaults
	// to 50.
	BatchSize int

	// Workers is how many keys one sweep resumes at once. Each resume is
	// bounded by Config.LockTimeout, so a sweep takes at most
	// ⌈BatchSize / Workers⌉ lock timeouts however slow the keys' downstreams
	// are. Defaults to 4.
	Workers int

	// MaxPerScope is the most keys of one scope a sweep picks; the first
	// key of every scope comes before the second of any (see
	// docs/operations.md, "Fairness"), so one scope's slow keys cannot
	// hold another scope's keys back. Defaults to 5.
	MaxPerScope int

	// Retention is how long a finished key is kept (and replayed) after it
	// finished; the sweep deletes older ones. Keep it at least as long as
	// clients retry, and no shorter than the downstreams keep their own
	// idempotency keys (Stripe: 24 hours). A negative value turns reaping
	// off. Defaults to 24h.
	Retention time.Duration

	// ReapBatchSize is how many keys one reaping statement deletes, which
	// keeps each transaction short. Defaults to 1000.
	ReapBatchSize int

	// MaxReapBatches bounds the reaping statements of one sweep; a backlog
	// is worked off over several sweeps. Defaults to 100.
	MaxReapBatches int

	// ParkedRetention is how long a parked key waits for an operator
	// before the sweep deletes it (counted from when it was parked; an
	// unpark starts the count again). A parked key holds a place in its
	// scope's Config.MaxUnfinishedPerScope and answers its client's retries
	// with its failure; deleted, the same client key is a new request.
	// Each deletion is logged and reported (EventParkedReaped). A negative
	// value keeps parked keys until an operator acts. Defaults to 7 days.
	ParkedRetention time.Duration

	// AuditRetention is how long the operators' audit trail keeps an
	// entry; the sweep deletes older ones, at most once an hour per
	// Sweeper (Runner.ReapAudit). A trail outlives its key and explains a
	// forced forget long after: keep it as long as your records must. A
	// negative value keeps every entry. Defaults to 400 days.
	AuditRetention time.Duration
}

// SweepResult counts what one sweep did.
type SweepResult struct {
	// Examined counts the abandoned keys the sweep tried to resume.
	Examined int
	// Completed counts the keys it resumed to a stored response.
	Completed int
	// Failed counts the keys whose resumed attempt failed again; they
	// rest for a backoff, or are parked (Parked counts those too).
	Failed int
	// Parked counts the keys parked by this sweep's attempts.
	Parked int
	// Busy counts the keys another process or a client retry took first.
	Busy int
	// UnknownWorkflow counts the abandoned keys left alone because this
	// process has not registered their workflow (up to
	// MaxUnknownWorkflowKeys). It counts the same keys again on every
	// sweep: it is a level, not an increment.
	UnknownWorkflow int
	// OtherVersion counts the abandoned keys of registered workflows left
	// to the processes that run their versions (Workflow.Version), up to
	// MaxUnknownWorkflowKeys: a level, as UnknownWorkflow. Keys whose
	// version no deployed process runs are parked instead (Parked).
	OtherVersion int
	// Reaped counts the finished keys deleted.
	Reaped int
	// ReapedParked counts the parked keys deleted after ParkedRetention.
	ReapedParked int
	// ReapedAudit counts the audit entries deleted after AuditRetention.
	ReapedAudit int
}

// Sweeper completes abandoned keys and reaps old ones for a Runner; see
// RunOnce. Make one with NewSweeper and run it with Run in every process
// that serves the Runner's workflows. It is safe for concurrent use.
type Sweeper struct {
	r   *Runner
	cfg SweepConfig
	// auditReaped is when this Sweeper last reaped the audit trail (Unix
	// nanoseconds; 0: never).
	auditReaped atomic.Int64
}

// NewSweeper returns a Sweeper over r's key store. It resumes keys of the
// workflows registered with r (Run registers the workflows it runs; use
// Register at start-up so that a process resumes keys before its first
// request). config may be nil for the defaults.
func NewSweeper(r *Runner, config *SweepConfig) (*Sweeper, error) {
	if r == nil {
		return nil, errors.New("atomicphase: NewSweeper needs a Runner")
	}
	var cfg SweepConfig
	if config != nil {
		cfg = *config
	}
	var errs []error
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"BatchSize", &cfg.BatchSize, DefaultSweepBatch}, {"ReapBatchSize", &cfg.ReapBatchSize, DefaultReapBatch},
		{"MaxReapBatches", &cfg.MaxReapBatches, DefaultMaxReapBatches}, {"Workers", &cfg.Workers, DefaultSweepWorkers},
		{"MaxPerScope", &cfg.MaxPerScope, DefaultMaxPerScope},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("SweepConfig.%s is %d; use a positive count, or 0 for the default %d", f.name, *f.v, f.def))
		}
	}
	switch {
	case cfg.Interval == 0:
		cfg.Interval = DefaultSweepInterval
	case cfg.Interval < time.Millisecond:
		errs = append(errs, fmt.Errorf("SweepConfig.Interval is %s; use at least 1ms, or 0 for the default %s", cfg.Interval, DefaultSweepInterval))
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultKeyRetention
	}
	if cfg.ParkedRetention == 0 {
		cfg.ParkedRetention = DefaultParkedRetention
	}
	if cfg.AuditRetention == 0 {
		cfg.AuditRetention = DefaultAuditRetention
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("atomicphase: invalid sweep config: %w", errors.Join(errs...))
	}
	return &Sweeper{r: r, cfg: cfg}, nil
}

// Run sweeps now and then every Interval (jittered) until ctx ends, and
// returns nil then. A sweep that fails is logged and reported to the
// Runner's Observer as a store error; the next one tries again.
func (s *Sweeper) Run(ctx context.Context) error {
	for {
		if _, err := s.RunOnce(ctx); err != nil && ctx.Err() == nil {
			s.r.logKey(ctx, slog.LevelError, "atomicphase: sweep failed", "", "", "", "error", err)
			s.r.observe(ctx, Event{Kind: EventStoreError, Err: err})
		}
		jitter := time.Duration(rand.Int64N(int64(s.cfg.Interval)/5*2+1)) - s.cfg.Interval/5
		t := time.NewTimer(s.cfg.Interval + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// RunOnce sweeps once: it resumes up to BatchSize abandoned keys (unfinished,
// not parked, unlocked or stale, past their backoff), each through Resume and
// so through the normal acquisition path, fencing and all; then it deletes
// finished keys older than Retention, in batches, and one batch of parked
// keys older than ParkedRetention, and (once an hour) the audit entries
// older than AuditRetention. It is what Run does on
// every tick, and what a test or a cron job calls. The error is the first
// statement of the sweep itself that failed; failures of the resumed keys
// are counted, not returned.
func (s *Sweeper) RunOnce(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	if err := s.complete(ctx, &res); err != nil {
		return res, err
	}
	if s.cfg.Retention > 0 {
		if err := s.reap(ctx, &res); err != nil {
			return res, err
		}
	}
	if s.cfg.ParkedRetention > 0 {
		n, err := s.r.ReapParked(ctx, s.cfg.ParkedRetention, s.cfg.ReapBatchSize)
		res.ReapedParked = n
		if err != nil {
			return res, err
		}
	}
	if last := s.auditReaped.Load(); s.cfg.AuditRetention > 0 && time.Since(time.Unix(0, last)) >= auditReapEvery &&
		s.auditReaped.CompareAndSwap(last, time.Now().UnixNano()) {
		n, err := s.r.ReapAudit(ctx, s.cfg.AuditRetention)
		res.ReapedAudit = n
		if err != nil {
			s.auditReaped.Store(last) // the next sweep tries again
			return res, err
		}
	}
	return res, nil
}

// minMarkPassed is the least number of unfinished keys a sweep marks due
// as its watermark passes them (keystore.Store.MarkPassed); the rest wait
// for the next sweep.
const minMarkPassed = 1000

// MaxUnknownWorkflowKeys bounds SweepResult.UnknownWorkflow: a sweep counts
// at most this many keys of workflows it does not know.
const MaxUnknownWorkflowKeys = 1000

func (s *Sweeper) complete(ctx context.Context, res *SweepResult) error {
	r := s.r
	names := r.workflowNames()
	// First the keys that never went wrong and whose process died: marked
	// due as the watermark passes them, they join the keys the rest reads.
	if _, err := r.store.MarkPassed(ctx, r.pool, max(s.cfg.BatchSize, minMarkPassed)); err != nil {
		return storeError("sweep: move the watermark", err)
	}
	counts, err := r.store.UnknownWorkflows(ctx, r.pool, names, MaxUnknownWorkflowKeys)
	if err != nil {
		return storeError("sweep: count keys of unknown workflows", err)
	}
	for _, c := range counts {
		res.UnknownWorkflow += c.N
		r.observe(ctx, Event{Kind: EventUnknownWorkflow, Workflow: c.Workflow, Count: c.N})
	}
	if len(names) == 0 {
		return nil
	}
	// The sweep is each process's heartbeat for the versions it runs.
	if err := r.announce(ctx); errors.Is(err, keystore.ErrVersionShape) {
		// Refused here from now on; the keys of the others go on.
		r.logKey(ctx, slog.LevelError, "atomicphase: a workflow version is declared for two phase lists", "", "", "", "error", err)
	} else if err != nil {
		return storeError("sweep: record the workflow versions", err)
	}
	versions := r.versionRefs()
	if err := s.otherVersions(ctx, res, names, versions); err != nil {
		return err
	}
	keys, err := r.store.Abandoned(ctx, r.pool, names, versions, r.phaseRefs(), s.cfg.BatchSize, s.cfg.MaxPerScope)
	if err != nil {
		return storeError("sweep: find abandoned keys", err)
	}
	// Workers resume the keys in the order picked: the first key of every
	// scope before the second of any.
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan keystore.Ref)
	for range min(s.cfg.Workers, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				resp, err := s.resumeOne(ctx, k.Workflow, k.Scope, k.Key)
				mu.Lock()
				s.count(ctx, res, k, resp, err)
				mu.Unlock()
			}
		}()
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		next <- k
	}
	close(next)
	wg.Wait()
	return ctx.Err()
}

// count adds a resumed key's outcome to res.
func (s *Sweeper) count(ctx context.Context, res *SweepResult, k keystore.Ref, resp *Response, err error) {
	r := s.r
	res.Examined++
	var pe *PhaseError
	switch {
	case errors.Is(err, errOtherVersion):
		res.OtherVersion++
	case err == nil && !resp.Replayed:
		res.Completed++
		r.observe(ctx, Event{Kind: EventZombieKey, Workflow: k.Workflow, Scope: k.Scope, Key: k.Key})
	case err == nil, errors.Is(err, ErrInProgress), errors.Is(err, ErrLockLost):
		res.Busy++ // someone else took it, or finished it, first
	case errors.As(err, &pe):
		res.Failed++
		if pe.Parked {
			res.Parked++
		}
	default:
		res.Failed++
		r.logKey(ctx, slog.LevelWarn, "atomicphase: sweep could not resume key", k.Workflow, k.Scope, k.Key, "error", err)
	}
}

// resumeOne resumes one abandoned key for the sweep. Each phase's
// function, call and commit gets the lock timeout (a hanging phase must not
// stall the whole sweep), and the attempt renews its lease as it goes, so a
// workflow of any length whose phases each fit is finished, fused units
// included. A phase that panics has parked its key; the panic is reported
// as that key's failure, and the sweep goes on.
func (s *Sweeper) resumeOne(ctx context.Context, workflow, scope, key string) (resp *Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, &PhaseError{Err: fmt.Errorf("panic: %v", p), Parked: true}
		}
	}()
	return s.r.resume(ctx, scope, key, resumeOpts{sweep: true, known: workflow})
}

// otherVersions counts the unfinished keys of registered workflows under
// versions this process does not run, and parks for good, one by one, those
// of versions no deployed process runs, so that nothing retakes them in a
// loop.
func (s *Sweeper) otherVersions(ctx context.Context, res *SweepResult, names, versions []string) error {
	r := s.r
	counts, err := r.store.OtherVersions(ctx, r.pool, names, versions, MaxUnknownWorkflowKeys)
	if err != nil {
		return storeError("sweep: count keys of other workflow versions", err)
	}
	deployed := map[string]map[string][]string{}
	for _, c := range counts {
		if deployed[c.Workflow] == nil {
			if deployed[c.Workflow], err = r.store.Deployed(ctx, r.pool, c.Workflow, r.cfg.VersionHorizon); err != nil {
				return storeError("sweep: look up the deployed workflow versions", err)
			}
		}
		if _, ok := deployed[c.Workflow][c.Version]; ok {
			res.OtherVersion += c.N
			continue
		}
		// No process runs the version: each key is taken and parked, with
		// the version named, by the resume that finds it cannot run it.
		keys, err := r.store.VersionKeys(ctx, r.pool, c.Workflow, c.Version, c.N)
		if err != nil {
			return storeError("sweep: list keys of an undeployed workflow version", err)
		}
		for _, k := range keys {
			resp, err := s.resumeOne(ctx, k.Workflow, k.Scope, k.Key)
			s.count(ctx, res, k, resp, err)
		}
	}
	return nil
}

func (s *Sweeper) reap(ctx context.Context, res *SweepResult) error {
	n, err := s.r.Reap(ctx, s.cfg.Retention, s.cfg.ReapBatchSize, s.cfg.MaxReapBatches)
	res.Reaped = n
	return err
}

// Reap deletes finished keys that finished longer than olderThan ago, in
// statements of at most batch keys, at most maxBatches of them, and returns
// how many it deleted. Unfinished and parked keys are never deleted. The
// Sweeper reaps on every sweep; Reap is for a cron job or the CLI.
func (r *Runner) Reap(ctx context.Context, olderThan time.Duration, batch, maxBatches int) (int, error) {
	if olderThan < 0 || batch <= 0 || maxBatches <= 0 {
		return 0, fmt.Errorf("atomicphase: Reap(%s, %d, %d): want a non-negative age and positive batch sizes", olderThan, batch, maxBatches)
	}
	total := 0
	for range maxBatches {
		n, err := r.store.Reap(ctx, r.pool, olderThan, batch)
		if err != nil {
			return total, storeError("reap keys", err)
		}
		total += n
		if n > 0 {
			r.observe(ctx, Event{Kind: EventTTLPruned, Count: n})
		}
		if n < batch {
			break
		}
	}
	return total, nil
}
