//go:build unix

package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/rdmatest"
)

// alloc maps n bytes of host memory, filled with fill, freed at the end of
// the test.
func alloc(t testing.TB, n int, fill byte) *rdma.HostMemory {
	t.Helper()
	m, err := rdma.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Error(err)
		}
	})
	b := m.Bytes()
	for i := range b {
		b[i] = fill
	}
	return m
}

// newEngine attaches an engine to f, closed at the end of the test.
func newEngine(t testing.TB, f *rdma.Fabric, name string, opts *rdma.LoopbackOptions) *rdma.Loopback {
	t.Helper()
	e, err := f.NewEngine(name, opts)
	if err != nil {
		t.Fatalf("NewEngine(%q) = %v", name, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close(%q) = %v", name, err)
		}
	})
	return e
}

func register(t testing.TB, e rdma.Engine, r rdma.Region) {
	t.Helper()
	if err := e.Register(r); err != nil {
		t.Fatalf("Register(%+v) = %v", r, err)
	}
}

func open(t testing.TB, e rdma.Engine, name string) rdma.SegmentID {
	t.Helper()
	id, err := e.Open(context.Background(), name)
	if err != nil {
		t.Fatalf("Open(%q) = %v", name, err)
	}
	return id
}

func sub(t testing.TB, r rdma.Region, off, n int) rdma.Region {
	t.Helper()
	s, err := r.Sub(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run submits reqs in one batch, waits, releases the batch and returns the
// results.
func run(t testing.TB, e rdma.Engine, reqs ...rdma.Request) []rdma.Result {
	t.Helper()
	b, err := e.NewBatch(len(reqs))
	if err != nil {
		t.Fatalf("NewBatch(%d) = %v", len(reqs), err)
	}
	if err := b.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	if err := b.Wait(context.Background()); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	if done, err := b.Poll(); !done || err != nil {
		t.Fatalf("Poll after Wait = %v, %v, want true, nil", done, err)
	}
	out := make([]rdma.Result, b.Len())
	for i := range out {
		out[i] = b.Result(i)
	}
	if err := b.Release(); err != nil {
		t.Fatalf("Release = %v", err)
	}
	return out
}

// firstNot returns the index of the first byte of b that is not c, or -1.
func firstNot(b []byte, c byte) int {
	for i, x := range b {
		if x != c {
			return i
		}
	}
	return -1
}

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*31+i>>8)
	}
}

func TestLoopbackReadWrite(t *testing.T) {
	f := rdma.NewFabric()
	a := newEngine(t, f, "a", nil)
	b := newEngine(t, f, "b", &rdma.LoopbackOptions{Workers: 1})
	am, bm := alloc(t, 1<<20, 0), alloc(t, 1<<20, 0)
	register(t, a, am.Region())
	register(t, b, bm.Region())
	pattern(am.Bytes(), 1)
	pattern(bm.Bytes(), 2)
	seg := open(t, a, "b")
	if seg == 0 {
		t.Fatalf("Open returned the zero SegmentID")
	}
	if again := open(t, a, "b"); again != seg {
		t.Errorf("second Open(b) = %d, want the same handle %d", again, seg)
	}
	ar, br := am.Region(), bm.Region()
	// a writes its first 4 KiB at b+8 KiB, and reads b's [64 KiB, +16 KiB)
	// into a+32 KiB.
	wantB := bytes.Clone(bm.Bytes())
	copy(wantB[8<<10:], am.Bytes()[:4<<10])
	wantA := bytes.Clone(am.Bytes())
	copy(wantA[32<<10:], bm.Bytes()[64<<10:80<<10])
	got := run(t, a,
		rdma.Request{Op: rdma.Write, Local: sub(t, ar, 0, 4<<10), Segment: seg, Remote: br.Addr + 8<<10},
		rdma.Request{Op: rdma.Read, Local: sub(t, ar, 32<<10, 16<<10), Segment: seg, Remote: br.Addr + 64<<10},
		rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: ar.Addr, Len: 0, Loc: rdma.Host}, Segment: seg, Remote: br.Addr},
	)
	want := []rdma.Result{{Status: rdma.Completed, Bytes: 4 << 10}, {Status: rdma.Completed, Bytes: 16 << 10}, {Status: rdma.Completed}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if !bytes.Equal(bm.Bytes(), wantB) {
		t.Errorf("b's memory after the write differs from the expected bytes")
	}
	if !bytes.Equal(am.Bytes(), wantA) {
		t.Errorf("a's memory after the read differs from the expected bytes")
	}
	// An engine may open its own segment: a local copy.
	self := open(t, b, "b")
	got = run(t, b, rdma.Request{Op: rdma.Write, Local: sub(t, br, 0, 100), Segment: self, Remote: br.Addr + 1000})
	if got[0].Status != rdma.Completed || !bytes.Equal(bm.Bytes()[1000:1100], bm.Bytes()[:100]) {
		t.Errorf("self write = %+v, bytes equal %v", got[0], bytes.Equal(bm.Bytes()[1000:1100], bm.Bytes()[:100]))
	}
}

// TestLoopbackBadInput checks that every local-side error is returned by
// Submit, names the request, submits nothing and touches no memory.
func TestLoopbackBadInput(t *testing.T) {
	f := rdma.NewFabric()
	a := newEngine(t, f, "a", nil)
	b := newEngine(t, f, "b", nil)
	// Each engine registers the middle of a larger mapping: the edges are
	// guard bytes that must never change.
	const page = 64 << 10
	am, bm := alloc(t, 3*page, 0xA1), alloc(t, 3*page, 0xB2)
	areg, breg := sub(t, am.Region(), page, page), sub(t, bm.Region(), page, page)
	register(t, a, areg)
	register(t, b, breg)
	seg := open(t, a, "b")
	good := rdma.Request{Op: rdma.Write, Local: sub(t, areg, 0, 64), Segment: seg, Remote: breg.Addr}
	for _, tc := range []struct {
		name string
		req  rdma.Request
		want error
	}{
		{"zero request", rdma.Request{}, rdma.ErrInvalidRequest},
		{"bad opcode", rdma.Request{Op: 7, Local: good.Local, Segment: seg, Remote: breg.Addr}, rdma.ErrInvalidRequest},
		{"negative length", rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: areg.Addr, Len: -1}, Segment: seg, Remote: breg.Addr}, rdma.ErrInvalidRequest},
		{"local at zero", rdma.Request{Op: rdma.Read, Local: rdma.Region{Len: 8}, Segment: seg, Remote: breg.Addr}, rdma.ErrInvalidRequest},
		{"remote at zero", rdma.Request{Op: rdma.Read, Local: good.Local, Segment: seg}, rdma.ErrInvalidRequest},
		{"remote wraps", rdma.Request{Op: rdma.Read, Local: good.Local, Segment: seg, Remote: ^uintptr(0) - 8}, rdma.ErrInvalidRequest},
		{"unknown segment", rdma.Request{Op: rdma.Read, Local: good.Local, Segment: seg + 5, Remote: breg.Addr}, rdma.ErrUnknownSegment},
		{"zero segment", rdma.Request{Op: rdma.Read, Local: good.Local, Remote: breg.Addr}, rdma.ErrUnknownSegment},
		{"local unregistered", rdma.Request{Op: rdma.Read, Local: sub(t, am.Region(), 0, 64), Segment: seg, Remote: breg.Addr}, rdma.ErrNotRegistered},
		{"local past the end", rdma.Request{Op: rdma.Read, Local: sub(t, am.Region(), 2*page-32, 64), Segment: seg, Remote: breg.Addr}, rdma.ErrNotRegistered},
		{"local before the start", rdma.Request{Op: rdma.Write, Local: sub(t, am.Region(), page-1, 64), Segment: seg, Remote: breg.Addr}, rdma.ErrNotRegistered},
		{"local in the peer's memory", rdma.Request{Op: rdma.Read, Local: sub(t, breg, 0, 64), Segment: seg, Remote: breg.Addr + 64}, rdma.ErrNotRegistered},
		{"local device memory", rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: areg.Addr, Len: 64, Loc: rdma.Device(0)}, Segment: seg, Remote: breg.Addr}, rdma.ErrNotRegistered},
	} {
		batch, err := a.NewBatch(4)
		if err != nil {
			t.Fatal(err)
		}
		// The bad request comes second: the good one before it must not
		// run either.
		err = batch.Submit([]rdma.Request{good, tc.req})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Submit = %v, want %v", tc.name, err, tc.want)
		} else if want := "request 1"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("%s: Submit error %q does not name %q", tc.name, err, want)
		}
		if n := batch.Len(); n != 0 {
			t.Errorf("%s: Len() after a failed Submit = %d, want 0", tc.name, n)
		}
		if err := batch.Release(); err != nil {
			t.Errorf("%s: Release = %v", tc.name, err)
		}
	}
	for _, m := range []struct {
		mem  *rdma.HostMemory
		fill byte
	}{{am, 0xA1}, {bm, 0xB2}} {
		if i := firstNot(m.mem.Bytes(), m.fill); i >= 0 {
			t.Errorf("byte %d of a mapping changed after rejected requests", i)
		}
	}

	// Batch capacity, over one call and over several.
	batch, err := a.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{good, good, good}); !errors.Is(err, rdma.ErrBatchFull) {
		t.Errorf("Submit(3 requests) to a batch of 2 = %v, want ErrBatchFull", err)
	}
	if err := batch.Submit([]rdma.Request{good}); err != nil {
		t.Fatalf("Submit(1) = %v", err)
	}
	if err := batch.Submit([]rdma.Request{good, good}); !errors.Is(err, rdma.ErrBatchFull) {
		t.Errorf("Submit(2 more) to a batch of 2 holding 1 = %v, want ErrBatchFull", err)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if batch.Len() != 1 || batch.Result(0).Status != rdma.Completed {
		t.Errorf("after rejected submits: Len %d, result %+v, want 1 completed", batch.Len(), batch.Result(0))
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if err := batch.Release(); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
	if err := batch.Submit([]rdma.Request{good}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Submit after Release = %v, want ErrClosed", err)
	}
	if _, err := a.NewBatch(0); err == nil {
		t.Errorf("NewBatch(0) = nil error")
	}

	// Registration errors.
	for _, tc := range []struct {
		name string
		r    rdma.Region
		want error
	}{
		{"overlap", sub(t, am.Region(), page+100, 10), rdma.ErrRegistered},
		{"device", rdma.Region{Addr: 0x10000, Len: 100, Loc: rdma.Device(0)}, rdma.ErrUnsupported},
		{"empty", rdma.Region{Addr: 0x10000, Loc: rdma.Host}, rdma.ErrInvalidRegion},
	} {
		if err := a.Register(tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: Register(%+v) = %v, want %v", tc.name, tc.r, err, tc.want)
		}
	}
	if err := a.Unregister(am.Region()); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Errorf("Unregister(unknown) = %v, want ErrNotRegistered", err)
	}
	if _, err := a.Open(context.Background(), "nobody"); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Open(nobody) = %v, want ErrUnknownSegment", err)
	}
	if err := a.CloseSegment(seg + 9); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("CloseSegment(unknown) = %v, want ErrUnknownSegment", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Open(ctx, "b"); !errors.Is(err, context.Canceled) {
		t.Errorf("Open(canceled ctx) = %v, want context.Canceled", err)
	}
}

// TestLoopbackRemoteOutOfRange checks that a remote range outside the
// peer's registered memory fails the request, moves nothing, and leaves
// the other requests of the batch alone.
func TestLoopbackRemoteOutOfRange(t *testing.T) {
	f := rdma.NewFabric()
	a := newEngine(t, f, "a", nil)
	b := newEngine(t, f, "b", nil)
	const page = 64 << 10
	am, bm := alloc(t, 3*page, 0xA1), alloc(t, 3*page, 0xB2)
	areg := sub(t, am.Region(), page, page)
	b1, b2 := sub(t, bm.Region(), 0, page), sub(t, bm.Region(), 2*page, page) // a gap between
	register(t, a, areg)
	register(t, b, b1)
	register(t, b, b2)
	seg := open(t, a, "b")
	local := sub(t, areg, 0, 128)
	bad := []uintptr{
		b1.End() - 64,        // crosses the end of b1 into the gap
		b1.End() + 100,       // inside the gap
		b2.Addr - 64,         // crosses into b2 from the gap
		b2.End() - 127,       // one byte past b2
		am.Region().Addr,     // a's own memory, not b's
		bm.Region().Addr - 1, // one byte before b1
	}
	var reqs []rdma.Request
	for _, addr := range bad {
		reqs = append(reqs, rdma.Request{Op: rdma.Write, Local: local, Segment: seg, Remote: addr})
		reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: addr})
	}
	reqs = append(reqs, rdma.Request{Op: rdma.Write, Local: local, Segment: seg, Remote: b2.End() - 128})
	got := run(t, a, reqs...)
	for i, r := range got[:len(got)-1] {
		if r.Status != rdma.Failed || r.Bytes != 0 {
			t.Errorf("request %d (%v at %#x) = %+v, want failed with 0 bytes", i, reqs[i].Op, reqs[i].Remote, r)
		}
	}
	if last := got[len(got)-1]; last.Status != rdma.Completed || last.Bytes != 128 {
		t.Errorf("in-range request = %+v, want completed with 128 bytes", last)
	}
	for i, c := range bm.Bytes()[:3*page-128] {
		if c != 0xB2 {
			t.Fatalf("b's byte %d = %#x after failed writes, want 0xB2", i, c)
		}
	}
	for i, c := range am.Bytes() {
		if c != 0xA1 {
			t.Fatalf("a's byte %d = %#x after failed reads, want 0xA1", i, c)
		}
	}
}

func TestLoopbackPeerClosed(t *testing.T) {
	f := rdma.NewFabric()
	a := newEngine(t, f, "a", nil)
	b, err := f.NewEngine("b", nil)
	if err != nil {
		t.Fatal(err)
	}
	am, bm := alloc(t, 4096, 1), alloc(t, 4096, 2)
	register(t, a, am.Region())
	register(t, b, bm.Region())
	seg := open(t, a, "b")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	got := run(t, a, rdma.Request{Op: rdma.Read, Local: am.Region(), Segment: seg, Remote: bm.Region().Addr})
	if got[0].Status != rdma.Failed {
		t.Errorf("read from a closed peer = %+v, want failed", got[0])
	}
	if _, err := a.Open(context.Background(), "b"); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Open(closed peer) = %v, want ErrUnknownSegment", err)
	}
	// The name is free again; the old handle does not reach the new engine.
	b2 := newEngine(t, f, "b", nil)
	bm2 := alloc(t, 4096, 3)
	register(t, b2, bm2.Region())
	got = run(t, a, rdma.Request{Op: rdma.Read, Local: am.Region(), Segment: seg, Remote: bm2.Region().Addr})
	if got[0].Status != rdma.Failed {
		t.Errorf("read through the old handle = %+v, want failed", got[0])
	}
	seg2 := open(t, a, "b")
	if got := run(t, a, rdma.Request{Op: rdma.Read, Local: am.Region(), Segment: seg2, Remote: bm2.Region().Addr}); got[0].Status != rdma.Completed || am.Bytes()[0] != 3 {
		t.Errorf("read from the new peer = %+v, byte %d", got[0], am.Bytes()[0])
	}
	if err := a.CloseSegment(seg2); err != nil {
		t.Errorf("CloseSegment = %v", err)
	}
	batch, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{{Op: rdma.Read, Local: am.Region(), Segment: seg2, Remote: bm2.Region().Addr}}); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Submit to a closed segment handle = %v, want ErrUnknownSegment", err)
	}

	// A closed engine refuses everything.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{{Op: rdma.Read, Local: am.Region(), Segment: seg, Remote: bm2.Region().Addr}}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Submit on a closed engine = %v, want ErrClosed", err)
	}
	if _, err := a.NewBatch(1); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("NewBatch on a closed engine = %v, want ErrClosed", err)
	}
	if err := a.Register(bm2.Region()); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Register on a closed engine = %v, want ErrClosed", err)
	}
	if _, err := a.Open(context.Background(), "b"); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Open on a closed engine = %v, want ErrClosed", err)
	}
	if err := batch.Release(); err != nil {
		t.Errorf("Release after the engine closed = %v, want nil", err)
	}
}

func TestFabric(t *testing.T) {
	f, g := rdma.NewFabric(), rdma.NewFabric()
	a := newEngine(t, f, "a", nil)
	newEngine(t, g, "b", nil)
	if _, err := f.NewEngine("a", nil); err == nil {
		t.Errorf("second NewEngine(a) on one fabric = nil error")
	}
	if _, err := f.NewEngine("", nil); err == nil {
		t.Errorf("NewEngine(\"\") = nil error")
	}
	if _, err := f.NewEngine("c", &rdma.LoopbackOptions{Workers: -1}); err == nil {
		t.Errorf("NewEngine(Workers -1) = nil error")
	}
	if _, err := a.Open(context.Background(), "b"); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Open of an engine on another fabric = %v, want ErrUnknownSegment", err)
	}
	if got := a.Segment(); got != "a" {
		t.Errorf("Segment() = %q, want a", got)
	}
}

// TestLoopbackUnregisterWhileCopying unregisters and unmaps memory while
// transfers read from and write into it: once Unregister returns, nothing
// may touch the memory (a copy that did would fault on the unmapped
// pages).
func TestLoopbackUnregisterWhileCopying(t *testing.T) {
	f := rdma.NewFabric()
	a := newEngine(t, f, "a", &rdma.LoopbackOptions{Workers: 2})
	b := newEngine(t, f, "b", &rdma.LoopbackOptions{Workers: 2})
	am := alloc(t, 1<<20, 7)
	register(t, a, am.Region())
	seg := open(t, a, "b")
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		bm, err := rdma.AllocHost(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		register(t, b, bm.Region())
		batch, err := a.NewBatch(64)
		if err != nil {
			t.Fatal(err)
		}
		var reqs []rdma.Request
		for i := range 64 {
			op := rdma.Read
			if i%2 == 1 {
				op = rdma.Write
			}
			reqs = append(reqs, rdma.Request{Op: op, Local: sub(t, am.Region(), i*16<<10, 16<<10), Segment: seg, Remote: bm.Region().Addr + uintptr(i*16<<10)})
		}
		if err := batch.Submit(reqs); err != nil {
			t.Fatal(err)
		}
		runtimeYield(round)
		if err := b.Unregister(bm.Region()); err != nil {
			t.Fatal(err)
		}
		if err := bm.Free(); err != nil {
			t.Fatal(err)
		}
		if err := batch.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := range 64 {
			if s := batch.Result(i).Status; s != rdma.Completed && s != rdma.Failed {
				t.Fatalf("round %d request %d = %v, want completed or failed", round, i, s)
			}
		}
		if err := batch.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// runtimeYield gives the workers a chance to start some copies before the
// unregistration, varying with the round.
func runtimeYield(round int) {
	var wg sync.WaitGroup
	wg.Add(round % 4)
	for range round % 4 {
		go wg.Done()
	}
	wg.Wait()
}

// TestLoopbackConcurrent moves distinct blocks between four engines from
// many goroutines and checks every byte.
func TestLoopbackConcurrent(t *testing.T) {
	f := rdma.NewFabric()
	const engines, block, blocks = 4, 4 << 10, 32
	es := make([]*rdma.Loopback, engines)
	mems := make([]*rdma.HostMemory, engines)
	for i := range es {
		es[i] = newEngine(t, f, fmt.Sprintf("e%d", i), &rdma.LoopbackOptions{Workers: 2})
		// Each engine's memory: a source half, and a destination half with
		// one slot per (peer, block).
		mems[i] = alloc(t, block*blocks+engines*block*blocks, 0)
		pattern(mems[i].Bytes()[:block*blocks], byte(i*40))
		register(t, es[i], mems[i].Region())
	}
	var wg sync.WaitGroup
	for i := range es {
		for j := range es {
			wg.Go(func() {
				seg, err := es[i].Open(context.Background(), fmt.Sprintf("e%d", j))
				if err != nil {
					t.Error(err)
					return
				}
				// i reads j's source blocks into its slots for j.
				batch, err := es[i].NewBatch(blocks)
				if err != nil {
					t.Error(err)
					return
				}
				defer batch.Release()
				var reqs []rdma.Request
				for k := range blocks {
					dst := rdma.Region{Addr: mems[i].Region().Addr + uintptr(block*blocks+(j*blocks+k)*block), Len: block, Loc: rdma.Host}
					reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: dst, Segment: seg, Remote: mems[j].Region().Addr + uintptr(k*block)})
				}
				if err := batch.Submit(reqs); err != nil {
					t.Error(err)
					return
				}
				for {
					done, err := batch.Poll()
					if err != nil {
						t.Error(err)
						return
					}
					if done {
						break
					}
					if err := batch.Wait(context.Background()); err != nil {
						t.Error(err)
						return
					}
				}
				for k := range blocks {
					if r := batch.Result(k); r.Status != rdma.Completed || r.Bytes != block {
						t.Errorf("e%d reading block %d of e%d = %+v", i, k, j, r)
					}
				}
			})
		}
	}
	wg.Wait()
	for i := range es {
		for j := range es {
			got := mems[i].Bytes()[block*blocks+j*blocks*block : block*blocks+(j+1)*blocks*block]
			if !bytes.Equal(got, mems[j].Bytes()[:block*blocks]) {
				t.Errorf("e%d's copy of e%d's blocks differs", i, j)
			}
		}
	}
}

// TestLoopbackConformance runs rdmatest's checks on two loopback engines,
// and on a pair whose first engine times out every request in its queue,
// before it moves a byte.
func TestLoopbackConformance(t *testing.T) {
	rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
		f := rdma.NewFabric()
		return newEngine(t, f, "a", nil), newEngine(t, f, "b", nil)
	}, rdmatest.Options{Late: func(t testing.TB) (rdma.Engine, rdma.Engine) {
		f := rdma.NewFabric()
		return newEngine(t, f, "a", &rdma.LoopbackOptions{Timeout: time.Nanosecond}), newEngine(t, f, "b", nil)
	}})
}
