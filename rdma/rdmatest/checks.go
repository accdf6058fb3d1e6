package rdmatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/zeebo/blake3"
)

const guard = 64 << 10

// mem is a span of host memory the checks allocated: rdma.AllocHost's, or
// Options.Alloc's.
type mem struct{ r rdma.Region }

func (m *mem) Region() rdma.Region { return m.r }
func (m *mem) Bytes() []byte       { return m.r.Bytes() }

// alloc allocates n bytes of host memory that e can register, filled with
// fill, freed at the end of the test.
func (s *suite) alloc(t testing.TB, e rdma.Engine, n int, fill byte) *mem {
	t.Helper()
	var r rdma.Region
	if s.opts.Alloc != nil {
		r = s.opts.Alloc(t, e, n)
		if r.Len != n || r.Loc != rdma.Host || r.Addr == 0 {
			t.Fatalf("Options.Alloc(%d) = %+v, want %d bytes of host memory", n, r, n)
		}
	} else {
		m, err := rdma.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		})
		r = m.Region()
	}
	b := r.Bytes()
	if len(b) > 0 {
		b[0] = fill
		for i := 1; i < len(b); i *= 2 {
			copy(b[i:], b[:i])
		}
	}
	return &mem{r}
}

// guarded allocates n bytes between two guards, all filled with fill,
// registers the middle with e and returns the mapping and the middle.
func (s *suite) guarded(t testing.TB, e rdma.Engine, n int, fill byte) (*mem, rdma.Region) {
	t.Helper()
	m := s.alloc(t, e, n+2*guard, fill)
	r, err := m.Region().Sub(guard, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Register(r); err != nil {
		t.Fatalf("Register(%d bytes) = %v", n, err)
	}
	// Cleanups run last first: the engine closes, ending every transfer,
	// before the memory is unmapped, also when a test stops early.
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return m, r
}

// checkGuards fails unless the guards of m still hold fill.
func checkGuards(t testing.TB, what string, m *mem, fill byte) {
	t.Helper()
	b := m.Bytes()
	for _, part := range [][]byte{b[:guard], b[len(b)-guard:]} {
		for i, c := range part {
			if c != fill {
				t.Fatalf("%s: guard byte %d = %#x, want %#x: a request touched memory outside registered regions", what, i, c, fill)
			}
		}
	}
}

func openSeg(t testing.TB, e rdma.Engine, name string) rdma.SegmentID {
	t.Helper()
	id, err := e.Open(context.Background(), name)
	if err != nil {
		t.Fatalf("Open(%q) = %v", name, err)
	}
	return id
}

// runBatch submits reqs in one batch, waits, releases and returns results.
func runBatch(t testing.TB, e rdma.Engine, reqs ...rdma.Request) []rdma.Result {
	t.Helper()
	b, err := e.NewBatch(len(reqs))
	if err != nil {
		t.Fatalf("NewBatch(%d) = %v", len(reqs), err)
	}
	if err := b.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("Wait = %v", err)
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

// fillPattern fills b with the output stream of BLAKE3 keyed by seed: a
// keyed hash of position that never repeats within a region, so a block
// moved from, or to, the wrong place, whatever the distance, differs from
// the right one.
func fillPattern(b []byte, seed byte) {
	var key [32]byte
	key[0] = seed
	h, err := blake3.NewKeyed(key[:])
	if err != nil {
		panic(err) // the key has the right size
	}
	if _, err := h.Digest().Read(b); err != nil {
		panic(err) // a Digest reads without error
	}
}

func (s *suite) readWrite(t testing.TB) {
	a, b := s.open(t)
	const n = regionSize
	am, ar := s.guarded(t, a, n, 0x11)
	bm, br := s.guarded(t, b, n, 0x22)
	fillPattern(ar.Bytes(), 1)
	fillPattern(br.Bytes(), 2)
	seg := openSeg(t, a, b.Segment())
	if again := openSeg(t, a, b.Segment()); again != seg {
		t.Errorf("second Open(%q) = %d, want %d", b.Segment(), again, seg)
	}
	wantA, wantB := bytes.Clone(ar.Bytes()), bytes.Clone(br.Bytes())
	var reqs []rdma.Request
	// Writes of a's first blocks to scattered places of b, reads of b's
	// last blocks into a's second half, of several sizes.
	off := 0
	for i, size := range []int{1, 7, 64, 4096, 65536, 100000, 1<<20 + 1, 3<<20 + 17, 9<<20 + 5} {
		src, _ := ar.Sub(off, size)
		dst := 3*n/8 - off - size - 13*i
		reqs = append(reqs, rdma.Request{Op: rdma.Write, Local: src, Segment: seg, Remote: br.Addr + uintptr(dst)})
		copy(wantB[dst:dst+size], wantA[off:off+size])
		off += size
	}
	// The writes land below 3n/8, the reads come from n/2 up: no request
	// reads what another writes.
	roff, src := n/2, n/2
	for _, size := range []int{3, 512, 8192, 200000, 2<<20 + 9, 5<<20 + 1, 12 << 20} {
		dst, _ := ar.Sub(roff, size)
		reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: dst, Segment: seg, Remote: br.Addr + uintptr(src)})
		copy(wantA[roff:roff+size], br.Bytes()[src:src+size])
		roff += size
		src += size
	}
	got := runBatch(t, a, reqs...)
	for i, r := range got {
		if r.Status != rdma.Completed || r.Bytes != int64(reqs[i].Local.Len) {
			t.Errorf("request %d (%v, %d bytes) = %+v, want completed", i, reqs[i].Op, reqs[i].Local.Len, r)
		}
	}
	if !bytes.Equal(br.Bytes(), wantB) {
		t.Errorf("the peer's memory after the writes differs from the expected bytes")
	}
	if !bytes.Equal(ar.Bytes(), wantA) {
		t.Errorf("the local memory after the reads differs from the expected bytes")
	}
	checkGuards(t, "local", am, 0x11)
	checkGuards(t, "peer", bm, 0x22)

	// Several Submits into one batch, polled to the end.
	batch, err := a.NewBatch(3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		l, _ := ar.Sub(i*100, 100)
		if err := batch.Submit([]rdma.Request{{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr + uintptr(1000*i)}}); err != nil {
			t.Fatalf("Submit %d = %v", i, err)
		}
	}
	if batch.Len() != 3 || batch.Cap() != 3 {
		t.Errorf("Len, Cap = %d, %d, want 3, 3", batch.Len(), batch.Cap())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := batch.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := batch.Result(i); r.Status != rdma.Completed || !bytes.Equal(ar.Bytes()[i*100:i*100+100], br.Bytes()[1000*i:1000*i+100]) {
			t.Errorf("submit %d: %+v, bytes equal %v", i, r, bytes.Equal(ar.Bytes()[i*100:i*100+100], br.Bytes()[1000*i:1000*i+100]))
		}
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) badInput(t testing.TB) {
	a, b := s.open(t)
	const n = 64 << 10
	am, ar := s.guarded(t, a, n, 0xA1)
	bm, br := s.guarded(t, b, n, 0xB2)
	seg := openSeg(t, a, b.Segment())
	local, _ := ar.Sub(0, 64)
	good := rdma.Request{Op: rdma.Write, Local: local, Segment: seg, Remote: br.Addr}
	outside := func(off int) rdma.Region {
		r, err := am.Region().Sub(off, 64)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name string
		req  rdma.Request
		want error
	}{
		{"zero request", rdma.Request{}, rdma.ErrInvalidRequest},
		{"opcode 0", rdma.Request{Op: 0, Local: local, Segment: seg, Remote: br.Addr}, rdma.ErrInvalidRequest},
		{"opcode 3", rdma.Request{Op: 3, Local: local, Segment: seg, Remote: br.Addr}, rdma.ErrInvalidRequest},
		{"negative length", rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: ar.Addr, Len: -5}, Segment: seg, Remote: br.Addr}, rdma.ErrInvalidRequest},
		{"remote wraps", rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: ^uintptr(0) - 10}, rdma.ErrInvalidRequest},
		{"unknown segment", rdma.Request{Op: rdma.Read, Local: local, Segment: seg + 100, Remote: br.Addr}, rdma.ErrUnknownSegment},
		{"local before the region", rdma.Request{Op: rdma.Read, Local: outside(guard - 32), Segment: seg, Remote: br.Addr}, rdma.ErrNotRegistered},
		{"local after the region", rdma.Request{Op: rdma.Read, Local: outside(guard + n - 32), Segment: seg, Remote: br.Addr}, rdma.ErrNotRegistered},
		{"local unregistered", rdma.Request{Op: rdma.Write, Local: outside(0), Segment: seg, Remote: br.Addr}, rdma.ErrNotRegistered},
		{"local is the peer's", rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: br.Addr, Len: 64, Loc: rdma.Host}, Segment: seg, Remote: br.Addr + 64}, rdma.ErrNotRegistered},
	} {
		batch, err := a.NewBatch(2)
		if err != nil {
			t.Fatal(err)
		}
		err = batch.Submit([]rdma.Request{good, tc.req})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Submit = %v, want %v", tc.name, err, tc.want)
		} else if !strings.Contains(err.Error(), "request 1") {
			t.Errorf("%s: Submit error %q does not name request 1", tc.name, err)
		}
		if n := batch.Len(); n != 0 {
			t.Errorf("%s: Len() after a refused Submit = %d, want 0", tc.name, n)
		}
		if err := batch.Release(); err != nil {
			t.Errorf("%s: Release = %v", tc.name, err)
		}
	}
	for _, m := range []struct {
		mem  *mem
		fill byte
	}{{am, 0xA1}, {bm, 0xB2}} {
		for i, c := range m.mem.Bytes() {
			if c != m.fill {
				t.Fatalf("byte %d of a mapping = %#x after refused requests, want %#x", i, c, m.fill)
			}
		}
	}
	for _, tc := range []struct {
		name string
		r    rdma.Region
		want error
	}{
		{"overlap", outside(guard + 100), rdma.ErrRegistered},
		{"device", rdma.Region{Addr: 0x10000, Len: 100, Loc: rdma.Device(0)}, rdma.ErrUnsupported},
		{"empty", rdma.Region{Addr: am.Region().Addr, Loc: rdma.Host}, rdma.ErrInvalidRegion},
	} {
		if err := a.Register(tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: Register(%+v) = %v, want %v", tc.name, tc.r, err, tc.want)
		}
	}
	if err := a.Unregister(outside(0)); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Errorf("Unregister(unregistered) = %v, want ErrNotRegistered", err)
	}
	if err := a.Unregister(rdma.Region{Addr: ar.Addr, Len: ar.Len - 1, Loc: rdma.Host}); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Errorf("Unregister(wrong length) = %v, want ErrNotRegistered", err)
	}
	if _, err := a.Open(context.Background(), "no-such-segment:1"); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Open(unknown) = %v, want ErrUnknownSegment", err)
	}
	if err := a.CloseSegment(seg + 100); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("CloseSegment(unknown) = %v, want ErrUnknownSegment", err)
	}
	if _, err := a.NewBatch(0); err == nil {
		t.Errorf("NewBatch(0) = nil error")
	}
	// Unregister and register again, then move bytes through the new
	// registration.
	if err := a.Unregister(ar); err != nil {
		t.Fatalf("Unregister = %v", err)
	}
	batch, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{good}); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Errorf("Submit from unregistered memory = %v, want ErrNotRegistered", err)
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if err := a.Register(ar); err != nil {
		t.Fatalf("Register again = %v", err)
	}
	if got := runBatch(t, a, good); got[0].Status != rdma.Completed {
		t.Errorf("write after registering again = %+v", got[0])
	}
}

func (s *suite) remote(t testing.TB) {
	a, b := s.open(t)
	const n = 64 << 10
	am, ar := s.guarded(t, a, n, 0x5A)
	bm, br := s.guarded(t, b, n, 0x6B)
	seg := openSeg(t, a, b.Segment())
	local, _ := ar.Sub(0, 128)
	bad := []uintptr{
		br.End() - 64,    // crosses the end
		br.End() + 4096,  // past the end
		br.Addr - 64,     // crosses the start
		br.Addr - 100000, // before, unmapped or not
		ar.Addr,          // the local engine's memory, not the peer's
	}
	var reqs []rdma.Request
	for _, addr := range bad {
		reqs = append(reqs,
			rdma.Request{Op: rdma.Write, Local: local, Segment: seg, Remote: addr},
			rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: addr})
	}
	reqs = append(reqs, rdma.Request{Op: rdma.Write, Local: local, Segment: seg, Remote: br.End() - 128})
	got := runBatch(t, a, reqs...)
	for i, r := range got[:len(got)-1] {
		if r.Status != rdma.Failed {
			t.Errorf("request %d (%v at %#x, outside the peer's memory) = %+v, want failed", i, reqs[i].Op, reqs[i].Remote, r)
		} else if r.Bytes != 0 {
			// The checks below find every destination byte untouched.
			t.Errorf("request %d (%v at %#x, outside the peer's memory) = %+v, want failed with 0 bytes moved: Result.Bytes counts bytes that moved", i, reqs[i].Op, reqs[i].Remote, r)
		}
	}
	if last := got[len(got)-1]; last.Status != rdma.Completed || last.Bytes != 128 {
		t.Errorf("the in-range request of the batch = %+v, want completed with 128 bytes", last)
	}
	checkGuards(t, "peer", bm, 0x6B)
	checkGuards(t, "local", am, 0x5A)
	for i, c := range ar.Bytes() {
		if c != 0x5A {
			t.Fatalf("local byte %d = %#x after failed reads, want 0x5A", i, c)
		}
	}
	for i, c := range br.Bytes()[:n-128] {
		if c != 0x6B {
			t.Fatalf("peer byte %d = %#x after failed writes, want 0x6B", i, c)
		}
	}
}

func (s *suite) batch(t testing.TB) {
	a, b := s.open(t)
	_, ar := s.guarded(t, a, 4096, 0)
	_, br := s.guarded(t, b, 4096, 0)
	seg := openSeg(t, a, b.Segment())
	l, _ := ar.Sub(0, 16)
	good := rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr}
	batch, err := a.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{good, good, good}); !errors.Is(err, rdma.ErrBatchFull) {
		t.Errorf("Submit(3) to a batch of 2 = %v, want ErrBatchFull", err)
	}
	if err := batch.Submit([]rdma.Request{good}); err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{good, good}); !errors.Is(err, rdma.ErrBatchFull) {
		t.Errorf("Submit(2) to a batch of 2 holding 1 = %v, want ErrBatchFull", err)
	}
	if err := batch.Submit(nil); err != nil {
		t.Errorf("Submit(nil) = %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := batch.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := batch.Poll(); !done || err != nil {
		t.Errorf("Poll after Wait = %v, %v", done, err)
	}
	if n, r := batch.Len(), batch.Result(0); n != 1 || r.Status != rdma.Completed || r.Bytes != 16 {
		t.Errorf("Len, Result(0) = %d, %+v, want 1, completed 16 bytes", n, r)
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
	// Zero-length requests complete with no bytes.
	zero := rdma.Request{Op: rdma.Write, Local: rdma.Region{Addr: ar.Addr, Loc: rdma.Host}, Segment: seg, Remote: br.Addr}
	if got := runBatch(t, a, zero); got[0].Status != rdma.Completed || got[0].Bytes != 0 {
		t.Errorf("zero-length request = %+v, want completed with 0 bytes", got[0])
	}
}

func (s *suite) concurrent(t testing.TB) {
	a, b := s.open(t)
	const block, blocks, workers = 4096, 64, 4
	_, ar := s.guarded(t, a, workers*blocks*block, 0)
	_, br := s.guarded(t, b, blocks*block, 0)
	fillPattern(br.Bytes(), 9)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			seg, err := a.Open(context.Background(), b.Segment())
			if err != nil {
				t.Error(err)
				return
			}
			for round := range 4 {
				batch, err := a.NewBatch(blocks / 4)
				if err != nil {
					t.Error(err)
					return
				}
				var reqs []rdma.Request
				for k := round * blocks / 4; k < (round+1)*blocks/4; k++ {
					l, _ := ar.Sub((w*blocks+k)*block, block)
					reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr + uintptr(k*block)})
				}
				if err := batch.Submit(reqs); err != nil {
					t.Error(err)
					return
				}
				if err := batch.Wait(context.Background()); err != nil {
					t.Error(err)
					return
				}
				for i := range reqs {
					if r := batch.Result(i); r.Status != rdma.Completed {
						t.Errorf("worker %d round %d request %d = %+v", w, round, i, r)
					}
				}
				if err := batch.Release(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		if !bytes.Equal(ar.Bytes()[w*blocks*block:(w+1)*blocks*block], br.Bytes()) {
			t.Errorf("worker %d's copy differs from the peer's memory", w)
		}
	}
}

func (s *suite) closed(t testing.TB) {
	a, b := s.open(t)
	_, ar := s.guarded(t, a, 4096, 0)
	_, br := s.guarded(t, b, 4096, 7)
	seg := openSeg(t, a, b.Segment())
	batch, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	name := b.Segment()
	if err := b.Close(); err != nil {
		t.Fatalf("Close(peer) = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close(peer) = %v, want nil", err)
	}
	// A request to a peer that closed fails (or is refused): it never
	// completes.
	l, _ := ar.Sub(0, 64)
	req := rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr}
	if err := batch.Submit([]rdma.Request{req}); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := batch.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if r := batch.Result(0); r.Status == rdma.Completed {
			t.Errorf("read from a closed peer = %+v, want not completed", r)
		}
	}
	for i, c := range ar.Bytes()[:64] {
		if c != 0 {
			t.Fatalf("byte %d read from a closed peer = %#x", i, c)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := batch.Submit([]rdma.Request{req}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Submit on a closed engine = %v, want ErrClosed", err)
	}
	if err := batch.Release(); err != nil {
		t.Errorf("Release after Close = %v, want nil", err)
	}
	if _, err := a.NewBatch(1); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("NewBatch on a closed engine = %v, want ErrClosed", err)
	}
	if _, err := a.Open(context.Background(), name); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Open on a closed engine = %v, want ErrClosed", err)
	}
	if err := a.Register(br); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Register on a closed engine = %v, want ErrClosed", err)
	}
	if err := a.Unregister(ar); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Unregister on a closed engine = %v, want ErrClosed", err)
	}
}

// confSettled checks that final means settled: once Wait returned nil,
// the caller reuses the local memory of every request, whatever its
// status, and nothing the engines do afterwards (Release, Unregister,
// Close) changes it. Half the requests read from outside the peer's
// memory and fail.
func (s *suite) settled(t testing.TB, open PairFunc) {
	a, b := open(t)
	const n, size = 8, 4096
	am, ar := s.guarded(t, a, n*size, 0x31)
	_, br := s.guarded(t, b, n*size, 0x42)
	fillPattern(br.Bytes(), 5)
	seg := openSeg(t, a, b.Segment())
	reqs := make([]rdma.Request, n)
	for i := range reqs {
		l, _ := ar.Sub(i*size, size)
		remote := br.Addr + uintptr(i*size)
		if i%2 == 1 {
			remote = br.End() - size/2 // crosses the end
		}
		reqs[i] = rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: remote}
	}
	batch, err := a.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := batch.Wait(ctx); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	statuses := make([]rdma.Status, n)
	for i := range statuses {
		r := batch.Result(i)
		statuses[i] = r.Status
		if !r.Status.Final() {
			t.Fatalf("request %d after Wait returned = %+v, want final", i, r)
		}
		if i%2 == 1 && r.Status == rdma.Completed {
			t.Errorf("request %d, outside the peer's memory, = %+v, want not completed", i, r)
		}
		checkBytes(t, fmt.Sprintf("request %d", i), reqs[i], r)
		if r.Status == rdma.Completed && !bytes.Equal(ar.Bytes()[i*size:(i+1)*size], br.Bytes()[i*size:(i+1)*size]) {
			t.Errorf("request %d completed, but its block differs from the peer's", i)
		}
	}
	// The caller reuses every block: recomputes those that did not
	// arrive, hands the others to new requests.
	reuse := bytes.Repeat([]byte{0xC5}, n*size)
	copy(ar.Bytes(), reuse)
	if err := batch.Release(); err != nil {
		t.Errorf("Release after Wait = %v, want nil", err)
	}
	if err := a.Unregister(ar); err != nil {
		t.Errorf("Unregister after Wait = %v, want nil", err)
	}
	for _, e := range []rdma.Engine{a, b} {
		if err := e.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
	for i := range n {
		if !bytes.Equal(ar.Bytes()[i*size:(i+1)*size], reuse[:size]) {
			t.Errorf("block %d (request %v) changed after Wait returned: the engine moved bytes of a final request", i, statuses[i])
		}
	}
	checkGuards(t, "local", am, 0x31)
}
