//go:build unix

package rdmatest

import (
	"context"
	"errors"
	"fmt"
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
		{"FailedCountsBytes", bugFailedBytes, "RemoteOutOfRange", "want failed with 0 bytes moved"},
		// Caught after a Poll that said done, by the request's status
		// (pending) or by its bytes (not moved), whichever the transport's
		// timing shows first.
		{"PollBeforeDoorbell", bugDoorbellPoll, "Submits", "after Poll reported submit"},
		{"ReleaseQueued", bugDoorbellRelease, "Busy", "Release returned nil while request 0"},
		{"UnregisterQueued", bugDoorbellUnregister, "Busy", "Poll after Unregister returned nil"},
		{"WaitFirstSubmit", bugWaitFirst, "Submits", "after Wait after submits 1 and 2: request 2"},
		{"MisplacedPastMiB", bugMisplaced, "ReadWrite", "differs from the expected bytes"},
		{"CloseSegmentDropsQueued", bugDoorbellCloseSegment, "ClosedSegment", "submitted before CloseSegment, ended"},
		{"CloseSegmentKeeps", bugCloseSegmentKeeps, "ClosedSegment", "Submit naming a handle CloseSegment forgot = <nil>"},
		{"CloseSegmentTwice", bugCloseSegmentTwice, "ClosedSegment", "CloseSegment of a handle already closed = <nil>"},
		{"ReopenStale", bugReopenStale, "ClosedSegment", "Open after CloseSegment gives a handle that works"},
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
	bugFailedBytes  = "reports a failed request's length as its bytes moved"
	bugMisplaced    = "reads from 128 KiB further for requests over 1 MiB"

	bugCloseSegmentKeeps = "CloseSegment returns nil and keeps the handle"
	bugCloseSegmentTwice = "CloseSegment of a handle it forgot returns nil"
	bugReopenStale       = "Open of a name again returns the handle CloseSegment forgot"

	// The doorbell bugs are of an engine that queues submitted requests
	// and hands them to its transport (rings the doorbell) at the next
	// Poll or Wait; without a bug, Poll and Wait ring before they look,
	// and Release and Unregister count queued requests as pending.
	bugDoorbell             = "queues requests until Poll or Wait (correct)"
	bugDoorbellPoll         = "Poll reports done from the transport before it rings the doorbell"
	bugDoorbellRelease      = "Release frees a batch whose queued requests were never rung"
	bugDoorbellUnregister   = "Unregister ignores requests queued in batches"
	bugWaitFirst            = "Wait rings the doorbell only if nothing was rung before"
	bugDoorbellCloseSegment = "CloseSegment drops the requests queued for the handle"
)

// doorbell reports whether bug is of an engine that queues requests.
func doorbell(bug string) bool {
	switch bug {
	case bugDoorbell, bugDoorbellPoll, bugDoorbellRelease, bugDoorbellUnregister, bugWaitFirst, bugDoorbellCloseSegment:
		return true
	}
	return false
}

// TestRunDoorbell runs the checks of pending requests on a correct engine
// that queues requests until Poll or Wait: the harness asks no more than
// the contract does.
func TestRunDoorbell(t *testing.T) {
	for _, only := range []string{"ReadWrite", "Submits", "Busy", "ClosedSegment", "Settled"} {
		got := runRecorded(t, loopbackPair(bugDoorbell), Options{}, only)
		if failed := got.FailedUnder("Run"); len(failed) > 0 {
			t.Errorf("Run failed %v for a correct engine that queues requests until Poll or Wait; it recorded:\n%s", failed, got)
		}
	}
}

// brokenEngine is an engine with one bug, on top of a correct one.
type brokenEngine struct {
	rdma.Engine
	bug string
	mu  struct {
		sync.Mutex
		batches []*brokenBatch
		closed  map[rdma.SegmentID]bool // handles CloseSegment forgot
		names   map[string]rdma.SegmentID
	}
}

// Open knows the handle again (but for bugReopenStale, which hands out
// the handle of the name that CloseSegment forgot).
func (e *brokenEngine) Open(ctx context.Context, name string) (rdma.SegmentID, error) {
	if e.bug == bugReopenStale {
		e.mu.Lock()
		id, ok := e.mu.names[name]
		stale := ok && e.mu.closed[id]
		e.mu.Unlock()
		if stale {
			return id, nil
		}
	}
	id, err := e.Engine.Open(ctx, name)
	if err == nil {
		e.mu.Lock()
		delete(e.mu.closed, id)
		if e.mu.names == nil {
			e.mu.names = make(map[string]rdma.SegmentID)
		}
		e.mu.names[name] = id
		e.mu.Unlock()
	}
	return id, err
}

// forgotten reports whether CloseSegment forgot the handle id.
func (e *brokenEngine) forgotten(id rdma.SegmentID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.closed[id]
}

func (e *brokenEngine) NewBatch(n int) (rdma.Batch, error) {
	b, err := e.Engine.NewBatch(n)
	if err != nil {
		return nil, err
	}
	bb := &brokenBatch{Batch: b, bug: e.bug, e: e}
	e.mu.Lock()
	e.mu.batches = append(e.mu.batches, bb)
	e.mu.Unlock()
	return bb, nil
}

// Unregister of a doorbell engine refuses while a queued request uses the
// region (but for bugDoorbellUnregister).
func (e *brokenEngine) Unregister(r rdma.Region) error {
	if doorbell(e.bug) && e.bug != bugDoorbellUnregister {
		e.mu.Lock()
		batches := e.mu.batches
		e.mu.Unlock()
		for _, b := range batches {
			b.mu.Lock()
			for _, q := range b.queue {
				if q.Local.Addr < r.End() && r.Addr < q.Local.End() {
					b.mu.Unlock()
					return fmt.Errorf("broken: %w", rdma.ErrBusy)
				}
			}
			b.mu.Unlock()
		}
	}
	return e.Engine.Unregister(r)
}

// CloseSegment of a doorbell engine first hands the requests queued for
// the handle to the transport, which resolved the handle when they were
// submitted (but for bugDoorbellCloseSegment, which drops them).
func (e *brokenEngine) CloseSegment(id rdma.SegmentID) error {
	if doorbell(e.bug) {
		e.mu.Lock()
		batches := e.mu.batches
		e.mu.Unlock()
		for _, b := range batches {
			b.mu.Lock()
			if e.bug == bugDoorbellCloseSegment {
				kept := b.queue[:0]
				for _, q := range b.queue {
					if q.Segment != id {
						kept = append(kept, q)
					}
				}
				b.queue = kept
			} else if err := b.ring(); err != nil {
				b.mu.Unlock()
				return err
			}
			b.mu.Unlock()
		}
	}
	if e.bug == bugCloseSegmentKeeps {
		return nil
	}
	err := e.Engine.CloseSegment(id)
	if e.bug == bugCloseSegmentTwice && errors.Is(err, rdma.ErrUnknownSegment) {
		return nil
	}
	if err == nil {
		e.mu.Lock()
		if e.mu.closed == nil {
			e.mu.closed = make(map[rdma.SegmentID]bool)
		}
		e.mu.closed[id] = true
		e.mu.Unlock()
	}
	return err
}

// ring hands the queued requests to the transport; b.mu is held.
func (b *brokenBatch) ring() error {
	q := b.queue
	b.queue = nil
	if len(q) == 0 {
		return nil
	}
	return b.Batch.Submit(q)
}

type brokenBatch struct {
	rdma.Batch
	bug string
	e   *brokenEngine

	// Of doorbell engines: requests submitted and not rung yet.
	queue []rdma.Request

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
	switch {
	case doorbell(b.bug):
		if len(b.reqs)+len(reqs) > b.Batch.Cap() {
			return fmt.Errorf("broken: %w", rdma.ErrBatchFull)
		}
		for i, r := range reqs {
			if err := rdma.CheckRequest(i, r); err != nil {
				return err
			}
			if b.e.forgotten(r.Segment) {
				return fmt.Errorf("broken: request %d: segment %d: %w", i, r.Segment, rdma.ErrUnknownSegment)
			}
		}
		b.queue = append(b.queue, reqs...)
	case b.bug == bugMisplaced:
		moved := append([]rdma.Request(nil), reqs...)
		for i := range moved {
			if moved[i].Local.Len > 1<<20 {
				moved[i].Remote += 128 << 10
			}
		}
		if err := b.Batch.Submit(moved); err != nil {
			return err
		}
	case b.bug == bugShort:
		short := append([]rdma.Request(nil), reqs...)
		for i := range short {
			if short[i].Local.Len > 1 {
				short[i].Local.Len--
			}
		}
		if err := b.Batch.Submit(short); err != nil {
			return err
		}
	case b.bug == bugEarlyDone:
		for i, r := range reqs {
			if err := rdma.CheckRequest(i, r); err != nil {
				return err
			}
		}
		b.held = append(b.held, reqs...)
	case b.bug == bugClosedSubmit:
		if err := b.Batch.Submit(reqs); err != nil && !errors.Is(err, rdma.ErrClosed) {
			return err
		}
		return nil
	case b.bug == bugNoCheck:
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
	if doorbell(b.bug) {
		if b.bug == bugDoorbellPoll {
			if done, err := b.Batch.Poll(); done || err != nil {
				b.mu.Lock()
				defer b.mu.Unlock()
				return done, errors.Join(err, b.ring())
			}
		}
		b.mu.Lock()
		err := b.ring()
		b.mu.Unlock()
		if err != nil {
			return false, err
		}
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
	if doorbell(b.bug) {
		b.mu.Lock()
		var err error
		if b.bug != bugWaitFirst || b.Batch.Len() == 0 {
			err = b.ring()
		}
		b.mu.Unlock()
		if err != nil {
			return err
		}
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
	if b.fixed || doorbell(b.bug) {
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
	if doorbell(b.bug) && i >= b.Batch.Len() {
		return rdma.Result{Status: rdma.Pending}
	}
	switch b.bug {
	case bugFailedBytes:
		r := b.Batch.Result(i)
		if r.Status == rdma.Failed {
			r.Bytes = int64(b.reqs[i].Local.Len)
		}
		return r
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
	if doorbell(b.bug) {
		b.mu.Lock()
		queued := len(b.queue)
		b.mu.Unlock()
		if queued > 0 {
			if b.bug != bugDoorbellRelease {
				return fmt.Errorf("broken: %w", rdma.ErrBusy)
			}
			return nil // the queued requests are forgotten, their memory not settled
		}
	}
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
