package storeconn_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// streamCopier issues each batch of copies as a CUDA stream of its own
// would: the copies run later, when the batch's completion is waited for.
// Like cudart's streams, a Wait with a cancellable context gives up when
// the context is done and returns while the copies are still queued; it
// records when that happens. It also pins host memory, records copies
// that touch host memory that is not pinned, and refuses to unpin memory
// that queued copies touch.
type streamCopier struct {
	mu        sync.Mutex
	queued    map[*streamBatch]bool // batches whose copies have not run
	gate      chan struct{}         // when set, CopyToDevice waits for it to close
	entered   chan struct{}         // closed when a gated CopyToDevice arrives
	failAfter int                   // CopyToDevice issues this many copies, then fails; < 0 never
	waitErr   error                 // when set, Wait fails with it and the copies stay queued
	failed    []*streamBatch        // batches whose Wait failed
	reused    int                   // copies issued to or from host memory that a failed batch touches
	early     int                   // Waits that returned with their copies queued
	pins      map[uintptr]int
	pinErr    error // PinHost fails with it when set
	unpinned  int   // copies whose host side was not pinned
	everPins  int
}

// streamBatch is the completion of one batch of a streamCopier.
type streamBatch struct {
	c      *streamCopier
	copies []connector.DeviceCopy // the copier's own copy of what was issued
	host   []rdma.Region          // the host side of each copy
}

// touches reports whether a copy of b reads or writes host memory in r.
func (b *streamBatch) touches(r rdma.Region) bool {
	for _, h := range b.host {
		if h.Addr < r.Addr+uintptr(r.Len) && r.Addr < h.Addr+uintptr(h.Len) {
			return true
		}
	}
	return false
}

func newStreamCopier() *streamCopier {
	return &streamCopier{failAfter: -1, pins: map[uintptr]int{}, queued: map[*streamBatch]bool{}}
}

func (c *streamCopier) pinned(addr uintptr, n int) bool {
	for a, l := range c.pins {
		if addr >= a && addr+uintptr(n) <= a+uintptr(l) {
			return true
		}
	}
	return false
}

func (c *streamCopier) enqueue(copies []connector.DeviceCopy, toDevice bool) (connector.CopyCompletion, error) {
	c.mu.Lock()
	gate, entered := c.gate, c.entered
	c.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b := &streamBatch{c: c}
	c.queued[b] = true
	for i, cp := range copies {
		if toDevice && c.failAfter >= 0 && i == c.failAfter {
			return b, fmt.Errorf("copy %d: device error", i)
		}
		host := cp.Dst
		if toDevice {
			host = cp.Src
		}
		if !c.pinned(host, cp.N) {
			c.unpinned++
		}
		r := rdma.Region{Addr: host, Len: cp.N, Loc: rdma.Host}
		for _, f := range c.failed {
			if f.touches(r) {
				c.reused++
			}
		}
		b.copies = append(b.copies, cp)
		b.host = append(b.host, r)
	}
	return b, nil
}

func (c *streamCopier) CopyToHost(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	return c.enqueue(copies, false)
}

func (c *streamCopier) CopyToDevice(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	return c.enqueue(copies, true)
}

func (b *streamBatch) Wait(ctx context.Context) error {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.queued[b] {
		return nil
	}
	if ctx.Err() != nil {
		c.early++
		return ctx.Err()
	}
	if c.waitErr != nil {
		if !slices.Contains(c.failed, b) {
			c.failed = append(c.failed, b)
		}
		return c.waitErr
	}
	runCopies(b.copies)
	delete(c.queued, b)
	return nil
}

func (c *streamCopier) PinHost(addr uintptr, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pinErr != nil {
		return c.pinErr
	}
	if _, ok := c.pins[addr]; ok {
		return errors.New("already pinned")
	}
	c.pins[addr] = n
	c.everPins++
	return nil
}

func (c *streamCopier) UnpinHost(addr uintptr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.pins[addr]
	if !ok {
		return errors.New("not pinned")
	}
	for b := range c.queued {
		if b.touches(rdma.Region{Addr: addr, Len: n, Loc: rdma.Host}) {
			return fmt.Errorf("unpin of %#x with copies from or to it queued", addr)
		}
	}
	delete(c.pins, addr)
	return nil
}

// state returns the copies queued, the Waits that returned early and the
// ranges pinned.
func (c *streamCopier) state() (queued, early, pins int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for b := range c.queued {
		queued += len(b.copies)
	}
	return queued, c.early, len(c.pins)
}

// ctxStore records the context of the latest Get.
type ctxStore struct {
	store.Store
	ctx atomic.Pointer[context.Context]
}

func (s *ctxStore) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	s.ctx.Store(&ctx)
	return s.Store.Get(ctx, keys, dst, res)
}

// waitFor waits until cond holds, failing after a generous bound with what
// it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for d := newDeadline(t, what); !cond(); d.tick() {
	}
}

// Close while a load's device copies are still being issued: the worker
// waits for their completion without cancellation before it unmaps the
// staging buffer.
func TestCloseWaitsForQueuedCopies(t *testing.T) {
	st := &ctxStore{Store: newMem(t)}
	cp := newStreamCopier()
	d := newDeviceRigOn(t, connector.BlockMajor, st, cp)
	d.saveFour()
	cp.mu.Lock()
	cp.gate, cp.entered = make(chan struct{}), make(chan struct{})
	entered, gate := cp.entered, cp.gate
	cp.mu.Unlock()
	d.loadFour()
	d.step(connector.Ready) // starts the load
	<-entered               // the load's copies are being issued
	closed := make(chan error, 1)
	go func() { closed <- d.w.Close() }()
	waitFor(t, "Close to cancel the worker's context", func() bool {
		p := st.ctx.Load()
		return p != nil && (*p).Err() != nil
	})
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	queued, early, pins := cp.state()
	if early > 0 || queued > 0 {
		t.Errorf("Close returned with %d device copies queued (%d synchronizes gave up on cancellation): they would land in unmapped staging memory", queued, early)
	}
	if pins != 0 {
		t.Errorf("%d staging buffers still pinned after Close", pins)
	}
}

// A batch of device copies that fails part-way leaves earlier copies
// queued: the worker waits for the batch's completion before it reports
// the blocks failed, so none lands in a block being recomputed.
func TestPartialCopyFailureSynchronizes(t *testing.T) {
	cp := newStreamCopier()
	d := newDeviceRigOn(t, connector.BlockMajor, newMem(t), cp)
	d.saveFour()
	cp.mu.Lock()
	cp.failAfter = 2
	cp.mu.Unlock()
	d.loadFour()
	var fails []connector.LoadFailure
	d.until("load failure", func(p *connector.Progress) bool {
		if len(p.Loaded) > 0 {
			t.Fatalf("load reported done although a device copy failed")
		}
		fails = append(fails, p.Failed...)
		return len(fails) > 0
	})
	if queued, _, _ := cp.state(); queued > 0 {
		t.Errorf("the blocks were reported failed with %d device copies still queued", queued)
	}
}

// Staging memory for device KV is pinned through the copier before any
// copy touches it, and unpinned after the last.
func TestStagingPinned(t *testing.T) {
	cp := newStreamCopier()
	d := newDeviceRigOn(t, connector.LayerMajor, newMem(t), cp)
	d.saveFour()
	d.loadFour()
	d.until("load", func(p *connector.Progress) bool { return len(p.Loaded) == 1 })
	if err := d.w.Close(); err != nil {
		t.Fatal(err)
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.everPins == 0 || cp.unpinned > 0 {
		t.Errorf("%d staging buffers pinned, %d copies from or to memory that was not pinned; want pinned staging only", cp.everPins, cp.unpinned)
	}
	if len(cp.pins) != 0 {
		t.Errorf("%d staging buffers still pinned after Close", len(cp.pins))
	}
}

// A copier that cannot pin memory still moves the blocks: through
// pageable staging memory, more slowly.
func TestStagingPinFails(t *testing.T) {
	cp := newStreamCopier()
	cp.pinErr = errors.New("cudaErrorHostMemoryAlreadyRegistered")
	d := newDeviceRigOn(t, connector.BlockMajor, newMem(t), cp)
	d.saveFour()
	d.loadFour()
	d.until("load", func(p *connector.Progress) bool {
		if len(p.Failed) > 0 {
			t.Fatalf("load failed because staging memory could not be pinned: %+v", p.Failed)
		}
		return len(p.Loaded) == 1
	})
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.everPins != 0 || cp.unpinned == 0 {
		t.Errorf("%d pins, %d unpinned copies; want staging through unpinned memory", cp.everPins, cp.unpinned)
	}
}

// When the completion of a batch of device copies fails, the device's
// state is unknown: the load fails, and its staging buffer is retired,
// never reused by a later batch, nor unpinned or freed, also by Close.
// One transfer goroutine, so that the save after the failure runs where
// the failed load ran.
func TestCopyWaitFailureRetiresStaging(t *testing.T) {
	cp := newStreamCopier()
	d := newDeviceRigWith(t, connector.BlockMajor, newMem(t), cp, map[string]any{"transfer_workers": 1})
	d.saveFour()
	cp.mu.Lock()
	cp.waitErr = errors.New("cudaErrorIllegalAddress")
	cp.mu.Unlock()
	d.loadFour()
	d.until("load failure", func(p *connector.Progress) bool {
		if len(p.Loaded) > 0 {
			t.Fatalf("load reported done although waiting for its device copies failed")
		}
		return len(p.Failed) > 0
	})
	cp.mu.Lock()
	cp.waitErr = nil
	cp.mu.Unlock()

	// A save of another prompt stages through a buffer of its own.
	toks := make([]hashing.Token, 2*bs+1)
	for i := range toks {
		toks[i] = hashing.Token(1000 + i)
	}
	hs, err := hashing.HashBlocks(bs, toks)
	if err != nil {
		t.Fatal(err)
	}
	other := &connector.Request{ID: "other", Prompt: len(toks), Hashes: hs}
	if err := d.s.Scheduled(other, other.Prompt, []connector.BlockID{5, 6, 7}); err != nil {
		t.Fatal(err)
	}
	d.step(connector.Ready)
	if keep, err := d.s.Finish(other, nil); err != nil {
		t.Fatal(err)
	} else if keep {
		d.until("release of the other prompt", func(p *connector.Progress) bool { return len(p.Released) == 1 })
	}
	if st := d.w.(connector.StatsReporter).Stats(); st.Saves != 4+2 {
		t.Fatalf("Saves = %d, want 6: the four blocks first saved and the other prompt's two", st.Saves)
	}
	if err := d.w.Close(); err != nil {
		t.Fatal(err)
	}
	queued, _, pins := cp.state()
	cp.mu.Lock()
	reused := cp.reused
	cp.mu.Unlock()
	if reused > 0 {
		t.Errorf("%d copies went to or from the staging memory of the batch whose wait failed", reused)
	}
	if queued == 0 || pins != 1 {
		t.Errorf("after Close: %d copies queued, %d buffers pinned; want the failed batch's copies queued and its buffer still pinned", queued, pins)
	}
}
