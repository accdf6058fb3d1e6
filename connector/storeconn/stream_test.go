package storeconn_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// streamCopier queues copies as a CUDA stream does: they run later, in
// order, and Synchronize waits for them. Like cudart's Stream, a
// Synchronize with a cancellable context gives up when the context is done
// and returns while copies are still queued; it records when that
// happens. It also pins host memory, and records copies that touch host
// memory that is not pinned.
type streamCopier struct {
	mu        sync.Mutex
	queued    []connector.DeviceCopy
	gate      chan struct{} // when set, CopyToDevice waits for it to close
	entered   chan struct{} // closed when a gated CopyToDevice arrives
	failAfter int           // CopyToDevice queues this many copies, then fails; < 0 never
	early     int           // Synchronize calls that returned with copies queued
	pins      map[uintptr]int
	pinErr    error // PinHost fails with it when set
	unpinned  int   // copies whose host side was not pinned
	everPins  int
}

func newStreamCopier() *streamCopier {
	return &streamCopier{failAfter: -1, pins: map[uintptr]int{}}
}

func (c *streamCopier) pinned(addr uintptr, n int) bool {
	for a, l := range c.pins {
		if addr >= a && addr+uintptr(n) <= a+uintptr(l) {
			return true
		}
	}
	return false
}

func (c *streamCopier) enqueue(copies []connector.DeviceCopy, toDevice bool) error {
	c.mu.Lock()
	gate, entered := c.gate, c.entered
	c.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cp := range copies {
		if toDevice && c.failAfter >= 0 && i == c.failAfter {
			return fmt.Errorf("copy %d: device error", i)
		}
		host := cp.Dst
		if toDevice {
			host = cp.Src
		}
		if !c.pinned(host, cp.N) {
			c.unpinned++
		}
		c.queued = append(c.queued, cp)
	}
	return nil
}

func (c *streamCopier) CopyToHost(copies []connector.DeviceCopy) error {
	return c.enqueue(copies, false)
}

func (c *streamCopier) CopyToDevice(copies []connector.DeviceCopy) error {
	return c.enqueue(copies, true)
}

func (c *streamCopier) Synchronize(ctx context.Context) error {
	if ctx.Done() != nil {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			if len(c.queued) > 0 {
				c.early++
			}
			c.mu.Unlock()
			return ctx.Err()
		default:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cp := range c.queued {
		dst := rdma.Region{Addr: cp.Dst, Len: cp.N, Loc: rdma.Host}
		src := rdma.Region{Addr: cp.Src, Len: cp.N, Loc: rdma.Host}
		copy(dst.Bytes(), src.Bytes())
	}
	c.queued = c.queued[:0]
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
	if len(c.queued) > 0 {
		return fmt.Errorf("unpin with %d copies queued", len(c.queued))
	}
	if _, ok := c.pins[addr]; !ok {
		return errors.New("not pinned")
	}
	delete(c.pins, addr)
	return nil
}

func (c *streamCopier) state() (queued, early, pins int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queued), c.early, len(c.pins)
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
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Close while a load's device copies are still queued: the worker waits
// for them without cancellation before it unmaps the staging buffer.
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
// queued: the worker waits for them before it reports the blocks failed,
// so none lands in a block being recomputed.
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
