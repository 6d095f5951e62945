package atomicphase

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkFaultPoint shows what a fault point costs on the hot path: with
// no injector configured, a nil check (no allocation, no lock).
func BenchmarkFaultPoint(b *testing.B) {
	ctx := context.Background()
	b.Run("no-injector", func(b *testing.B) {
		a := &attempt{r: &Runner{}, wf: MustWorkflow("w", func(struct{}, *Request) (struct{}, error) { return struct{}{}, nil }, []Phase[struct{}]{Local("p", noopPhase)}, nil)}
		b.ReportAllocs()
		for b.Loop() {
			if err := a.fault(ctx, "p", BeforeCommit, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("injector-never-fires", func(b *testing.B) {
		r := &Runner{cfg: Config{FaultInjector: FaultInjectorFunc(func(context.Context, FaultPoint, *pgx.Conn) error { return nil })}}
		a := &attempt{r: r, wf: MustWorkflow("w", func(struct{}, *Request) (struct{}, error) { return struct{}{}, nil }, []Phase[struct{}]{Local("p", noopPhase)}, nil)}
		b.ReportAllocs()
		for b.Loop() {
			if err := a.fault(ctx, "p", BeforeCommit, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestFaultPointWithoutInjectorAllocatesNothing(t *testing.T) {
	a := &attempt{r: &Runner{}, wf: MustWorkflow("w", func(struct{}, *Request) (struct{}, error) { return struct{}{}, nil }, []Phase[struct{}]{Local("p", noopPhase)}, nil)}
	allocs := testing.AllocsPerRun(1000, func() { _ = a.fault(context.Background(), "p", BeforeCommit, nil) })
	if allocs != 0 {
		t.Fatalf("a fault point without an injector allocated %v times", allocs)
	}
}

func noopPhase(context.Context, Tx, *struct{}) (Outcome, error) { return Continue(), nil }
