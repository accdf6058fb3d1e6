package rdmatest

import (
	"errors"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
)

// PairFunc opens two engines that reach each other's segments: the first
// opens the second's [rdma.Engine.Segment] and moves bytes to and from its
// registered memory. The engines must be closed at the end of the test
// (t.Cleanup); Run closes some of them earlier, so Close must be
// idempotent.
type PairFunc func(t testing.TB) (a, b rdma.Engine)

// Options declares what the engines under test can do beyond the basics,
// so that [Run] checks that and nothing they do not claim. The zero
// Options declares engines that register any host memory from
// [rdma.AllocHost] and whose transfers never outlive their transport.
type Options struct {
	// Late, when set, opens a pair whose first engine's transfers outlive
	// the transport's delivery timeout and may still move their bytes
	// after it reported them timed out (Mooncake with MC_SLICE_TIMEOUT):
	// Run then checks that such a request stays pending until it is
	// settled. Without it that check is skipped.
	Late PairFunc

	// Alloc, when set, allocates n bytes of host memory that engine e (one
	// of a pair from the PairFunc) can register, and frees it at the end
	// of the test (t.Cleanup). Run fills the bytes itself. Engines that
	// take only memory of their own (shared memory that a peer process
	// maps) declare their allocator here. Nil means [rdma.AllocHost].
	Alloc func(t testing.TB, e rdma.Engine, n int) rdma.Region
}

// Run checks the engines that open returns against the promises of
// [rdma.Engine], in subtests: ReadWrite, BadInput, RemoteOutOfRange,
// Submits, Busy, Batch, Concurrent, Closed, Settled and SettledLate (skipped without
// Options.Late).
func Run(t *testing.T, open PairFunc, opts Options) {
	t.Helper()
	run(tt{t}, open, opts, "")
}

// tester is the part of a test that Run uses: testing.TB and subtests. Run
// takes a *testing.T; the package's own tests pass a recorder that runs
// the same subtests against engines that are broken on purpose.
type tester interface {
	testing.TB
	run(name string, f func(t testing.TB)) bool
}

// tt adapts *testing.T to tester.
type tt struct{ *testing.T }

func (t tt) run(name string, f func(t testing.TB)) bool {
	return t.T.Run(name, func(t *testing.T) { f(t) })
}

// run runs Run's subtests, or only the one named only if it is not "".
func run(t tester, open PairFunc, opts Options, only string) {
	t.Helper()
	if opts.Alloc == nil {
		probe, err := rdma.AllocHost(1)
		if errors.Is(err, rdma.ErrUnsupported) {
			t.Skipf("rdmatest: needs host memory: %v", err)
		}
		if err != nil {
			t.Fatalf("rdmatest: %v", err)
		}
		if err := probe.Free(); err != nil {
			t.Fatalf("rdmatest: %v", err)
		}
	}
	s := &suite{open: open, opts: opts}
	for _, sub := range []struct {
		name string
		f    func(t testing.TB)
	}{
		{"ReadWrite", s.readWrite},
		{"BadInput", s.badInput},
		{"RemoteOutOfRange", s.remote},
		{"Submits", s.submits},
		{"Busy", s.busy},
		{"ClosedSegment", s.closedSegment},
		{"Batch", s.batch},
		{"Concurrent", s.concurrent},
		{"Closed", s.closed},
		{"Settled", func(t testing.TB) { s.settled(t, s.open) }},
		{"SettledLate", func(t testing.TB) {
			if s.opts.Late == nil {
				t.Skip("the engines under test cannot be made to outlive their transport's timeout (Options.Late)")
			}
			s.settled(t, s.opts.Late)
		}},
	} {
		if only == "" || sub.name == only {
			t.run(sub.name, sub.f)
		}
	}
}

// suite holds what the checks share.
type suite struct {
	open PairFunc
	opts Options
}
