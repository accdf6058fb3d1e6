//go:build unix

package rdma

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// hostPair returns engines a and b on one fabric, each with 64 KiB of
// registered host memory, and a's handle of b's segment.
func hostPair(t *testing.T, aOpts *LoopbackOptions) (a, b *Loopback, am, bm *HostMemory, seg SegmentID) {
	t.Helper()
	f := NewFabric()
	var err error
	if a, err = f.NewEngine("a", aOpts); err != nil {
		t.Fatal(err)
	}
	if b, err = f.NewEngine("b", nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []**HostMemory{&am, &bm} {
		if *m, err = AllocHost(64 << 10); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, e := range []*Loopback{a, b} {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		}
		for _, m := range []*HostMemory{am, bm} {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		}
	})
	if err := a.Register(am.Region()); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(bm.Region()); err != nil {
		t.Fatal(err)
	}
	if seg, err = a.Open(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	return a, b, am, bm, seg
}

func reads(am, bm *HostMemory, seg SegmentID, n int) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Op: Read, Local: Region{Addr: am.Region().Addr + uintptr(i*1024), Len: 1024, Loc: Host}, Segment: seg, Remote: bm.Region().Addr + uintptr(i*1024)}
	}
	return reqs
}

// gate blocks the engine's single worker before its first request until
// the returned release function is called; entered is closed once the
// worker waits there.
func gate(e *Loopback) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	e.hooks.beforeRun = func() {
		if first.CompareAndSwap(false, true) {
			close(in)
			<-out
		}
	}
	return in, func() { close(out) }
}

// TestLoopbackCloseCancels closes an engine with one request running and
// three queued: the queued ones end Canceled and move nothing, the running
// one completes, and Close waits for it.
func TestLoopbackCloseCancels(t *testing.T) {
	a, _, am, bm, seg := hostPair(t, &LoopbackOptions{Workers: 1})
	for i, c := range bm.Bytes() {
		bm.Bytes()[i] = c + 9
	}
	entered, release := gate(a)
	a.hooks.canceled = release
	batch, err := a.NewBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 4)); err != nil {
		t.Fatal(err)
	}
	<-entered
	if done, _ := batch.Poll(); done {
		t.Fatalf("Poll = done while the worker is held")
	}
	if err := batch.Release(); !errors.Is(err, ErrBusy) {
		t.Errorf("Release with pending requests = %v, want ErrBusy", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	want := []Status{Completed, Canceled, Canceled, Canceled}
	for i, w := range want {
		if got := batch.Result(i).Status; got != w {
			t.Errorf("request %d = %v, want %v", i, got, w)
		}
	}
	for i, c := range am.Bytes()[1024:4096] {
		if c != 0 {
			t.Fatalf("byte %d of a canceled request's destination = %d, want 0", 1024+i, c)
		}
	}
	if err := batch.Release(); err != nil {
		t.Errorf("Release after Close = %v, want nil", err)
	}
}

// TestLoopbackWaitContext checks that Wait returns when its context ends
// and that the requests go on.
func TestLoopbackWaitContext(t *testing.T) {
	a, _, am, bm, seg := hostPair(t, &LoopbackOptions{Workers: 1})
	entered, release := gate(a)
	batch, err := a.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 2)); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := a.Unregister(am.Region()); !errors.Is(err, ErrBusy) {
		t.Errorf("Unregister of memory pending requests use = %v, want ErrBusy", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := batch.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(canceled) = %v, want context.Canceled", err)
	}
	release()
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r := batch.Result(i); r.Status != Completed || r.Bytes != 1024 {
			t.Errorf("request %d = %+v, want completed", i, r)
		}
	}
	if err := batch.Release(); err != nil {
		t.Error(err)
	}
	if err := a.Unregister(am.Region()); err != nil {
		t.Errorf("Unregister once the requests are final = %v", err)
	}
}

// TestLoopbackTimeout runs requests on a clock that jumps past the
// timeout between submission and execution.
func TestLoopbackTimeout(t *testing.T) {
	a, _, am, bm, seg := hostPair(t, &LoopbackOptions{Workers: 1, Timeout: time.Second})
	var offset atomic.Int64
	base := time.Now()
	a.now = func() time.Time { return base.Add(time.Duration(offset.Load())) }
	bm.Bytes()[0] = 42
	// Within the timeout: completes.
	batch, err := a.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 1)); err != nil {
		t.Fatal(err)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := batch.Result(0); r.Status != Completed {
		t.Errorf("request within the timeout = %+v, want completed", r)
	}
	// The clock jumps 2 s before the worker runs the next one.
	a.hooks.beforeRun = func() { offset.Store(int64(2 * time.Second)) }
	am.Bytes()[0] = 0
	if err := batch.Submit(reads(am, bm, seg, 1)); err != nil {
		t.Fatal(err)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := batch.Result(1); r.Status != Timeout || r.Bytes != 0 {
		t.Errorf("request past the timeout = %+v, want timeout with 0 bytes", r)
	}
	if am.Bytes()[0] != 0 {
		t.Errorf("a timed-out read wrote its destination")
	}
}
