//go:build unix

package rdmatest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/internal/mapped"
	"github.com/kvconnect/kvconnect/rdma"
)

// loopbackPair opens two loopback engines on a fabric of their own; with
// bug, the first is broken that way.
func loopbackPair(bug string) PairFunc {
	return func(t testing.TB) (rdma.Engine, rdma.Engine) {
		f := rdma.NewFabric()
		var es [2]rdma.Engine
		for i, name := range []string{"a", "b"} {
			e, err := f.NewEngine(name, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := e.Close(); err != nil {
					t.Error(err)
				}
			})
			es[i] = e
		}
		if bug != "" {
			es[0] = &brokenEngine{Engine: es[0], bug: bug}
		}
		return es[0], es[1]
	}
}

// TestRunLoopback runs the harness on correct engines under the recorder
// that the broken engines run under: it must record no failure, so that a
// failure recorded for a broken engine is the bug's.
func TestRunLoopback(t *testing.T) {
	got := runRecorded(t, loopbackPair(""), Options{}, "")
	if failed := got.FailedUnder("Run"); len(failed) > 0 {
		t.Errorf("Run failed %v for correct loopback engines; it recorded:\n%s", failed, got)
	}
}

// TestRunAlloc runs the harness with Options.Alloc and checks that every
// byte it registers comes from there.
func TestRunAlloc(t *testing.T) {
	var mu sync.Mutex
	var allocated []rdma.Region
	got := runRecorded(t, loopbackPair(""), Options{Alloc: func(t testing.TB, e rdma.Engine, n int) rdma.Region {
		m, err := rdma.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		})
		mu.Lock()
		allocated = append(allocated, m.Region())
		mu.Unlock()
		return m.Region()
	}}, "ReadWrite")
	if failed := got.FailedUnder("Run"); len(failed) > 0 {
		t.Errorf("Run with Options.Alloc failed %v; it recorded:\n%s", failed, got)
	}
	if len(allocated) != 2 {
		t.Errorf("ReadWrite called Options.Alloc %d times, want 2 (one per engine)", len(allocated))
	}
}

// TestRunCatchesBrokenEngines runs the harness against engines with one
// deliberate bug each and checks that it fails, in the subtest that owns
// that kind of bug, saying why.
func TestRunCatchesBrokenEngines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bug    string
		caught string // the subtest that must fail
		reason string // what it must say
	}{
		{"OneByteShort", bugShort, "ReadWrite", "differs from the expected bytes"},
		{"WritesPastRange", bugPast, "ReadWrite", "differs from the expected bytes"},
		{"WritesPastRegion", bugPast, "RemoteOutOfRange", "guard byte"},
		{"DoneBeforeMoved", bugEarlyDone, "ReadWrite", "bytes equal false"},
		{"DoneBeforeMovedSettled", bugEarlyDone, "Settled", "differs from the peer's"},
		{"SubmitsWhenClosed", bugClosedSubmit, "Closed", "Submit on a closed engine = <nil>"},
		{"IgnoresRemoteRange", bugIgnoresRange, "RemoteOutOfRange", "want failed"},
		{"IgnoresRemoteRangeSettled", bugIgnoresRange, "Settled", "want not completed"},
		{"AcceptsBadInput", bugNoCheck, "BadInput", "Submit = <nil>, want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runRecorded(t, loopbackPair(tc.bug), Options{}, tc.caught)
			if failed := got.FailedUnder("Run/" + tc.caught); len(failed) == 0 {
				t.Errorf("Run did not fail in %s for an engine with bug %s; it recorded:\n%s", tc.caught, tc.bug, got)
			} else if !got.SaidUnder("Run/"+tc.caught, tc.reason) {
				t.Errorf("Run failed in %s for an engine with bug %s, but never said %q; it recorded:\n%s", failed, tc.bug, tc.reason, got)
			}
		})
	}
}

// The bugs of brokenEngine.
const (
	bugShort        = "copies one byte short and reports every byte"
	bugPast         = "writes one byte past the remote range"
	bugEarlyDone    = "reports requests done before it moves their bytes, which it moves at Release"
	bugClosedSubmit = "accepts requests on a closed engine"
	bugIgnoresRange = "moves bytes outside the peer's registered memory and reports them completed"
	bugNoCheck      = "submits the valid requests of a batch with invalid ones"
)

// brokenEngine is an engine with one bug, on top of a correct one.
type brokenEngine struct {
	rdma.Engine
	bug string
}

func (e *brokenEngine) NewBatch(n int) (rdma.Batch, error) {
	b, err := e.Engine.NewBatch(n)
	if err != nil {
		return nil, err
	}
	return &brokenBatch{Batch: b, bug: e.bug}, nil
}

type brokenBatch struct {
	rdma.Batch
	bug string

	mu       sync.Mutex
	reqs     []rdma.Request      // as asked for
	held     []rdma.Request      // bugEarlyDone: not submitted yet
	override map[int]rdma.Result // results the bug reports instead
	fixed    bool                // the after-Wait bug ran
}

// bytesOf returns the host bytes [addr, addr+n).
func bytesOf(addr uintptr, n int) []byte {
	return rdma.Region{Addr: addr, Len: n, Loc: rdma.Host}.Bytes()
}

func (b *brokenBatch) Submit(reqs []rdma.Request) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.bug {
	case bugShort:
		short := append([]rdma.Request(nil), reqs...)
		for i := range short {
			if short[i].Local.Len > 1 {
				short[i].Local.Len--
			}
		}
		if err := b.Batch.Submit(short); err != nil {
			return err
		}
	case bugEarlyDone:
		for i, r := range reqs {
			if err := rdma.CheckRequest(i, r); err != nil {
				return err
			}
		}
		b.held = append(b.held, reqs...)
	case bugClosedSubmit:
		if err := b.Batch.Submit(reqs); err != nil && !errors.Is(err, rdma.ErrClosed) {
			return err
		}
		return nil
	case bugNoCheck:
		for _, r := range reqs {
			if b.Batch.Submit([]rdma.Request{r}) == nil {
				b.reqs = append(b.reqs, r)
			}
		}
		return nil
	default:
		if err := b.Batch.Submit(reqs); err != nil {
			return err
		}
	}
	b.reqs = append(b.reqs, reqs...)
	return nil
}

func (b *brokenBatch) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

func (b *brokenBatch) Poll() (bool, error) {
	if b.bug == bugEarlyDone {
		return true, nil
	}
	done, err := b.Batch.Poll()
	if done && err == nil {
		b.afterWait()
	}
	return done, err
}

func (b *brokenBatch) Wait(ctx context.Context) error {
	if b.bug == bugEarlyDone {
		return nil
	}
	if err := b.Batch.Wait(ctx); err != nil {
		return err
	}
	b.afterWait()
	return nil
}

// afterWait does what the bugs do once the correct engine is done.
func (b *brokenBatch) afterWait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fixed {
		return
	}
	b.fixed = true
	for i, r := range b.reqs {
		res := b.Batch.Result(i)
		switch {
		case b.bug == bugPast && r.Op == rdma.Write && res.Status == rdma.Completed && r.Local.Len > 0:
			bytesOf(r.Remote+uintptr(r.Local.Len), 1)[0] ^= 0xFF
		case b.bug == bugIgnoresRange && res.Status == rdma.Failed && r.Local.Len > 0:
			if mapped.Check(r.Remote, r.Local.Len) == nil {
				remote, local := bytesOf(r.Remote, r.Local.Len), r.Local.Bytes()
				if r.Op == rdma.Read {
					copy(local, remote)
				} else {
					copy(remote, local)
				}
			}
			if b.override == nil {
				b.override = make(map[int]rdma.Result)
			}
			b.override[i] = rdma.Result{Status: rdma.Completed, Bytes: int64(r.Local.Len)}
		}
	}
}

func (b *brokenBatch) Result(i int) rdma.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.bug {
	case bugEarlyDone:
		return rdma.Result{Status: rdma.Completed, Bytes: int64(b.reqs[i].Local.Len)}
	case bugShort:
		r := b.Batch.Result(i)
		if r.Status == rdma.Completed {
			r.Bytes = int64(b.reqs[i].Local.Len)
		}
		return r
	}
	if r, ok := b.override[i]; ok {
		return r
	}
	return b.Batch.Result(i)
}

func (b *brokenBatch) Release() error {
	b.mu.Lock()
	held := b.held
	b.held = nil
	b.mu.Unlock()
	if len(held) > 0 {
		// The bytes move now, long after Wait said they had.
		if err := b.Batch.Submit(held); err == nil {
			if err := b.Batch.Wait(context.Background()); err != nil {
				return err
			}
		}
	}
	return b.Batch.Release()
}
