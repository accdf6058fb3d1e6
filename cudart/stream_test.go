package cudart

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// blocks returns n copies of size bytes, with a zero-length copy after
// every fourth one.
func blocks(n, size int) []Copy {
	var cs []Copy
	for i := range n {
		cs = append(cs, Copy{Dst: uintptr(0x10_0000 + i*size), Src: uintptr(0x90_0000 + i*size), N: size})
		if i%4 == 3 {
			cs = append(cs, Copy{N: 0})
		}
	}
	return cs
}

func nonEmpty(cs []Copy) (dsts, srcs, sizes []uintptr) {
	for _, c := range cs {
		if c.N > 0 {
			dsts = append(dsts, c.Dst)
			srcs = append(srcs, c.Src)
			sizes = append(sizes, uintptr(c.N))
		}
	}
	return dsts, srcs, sizes
}

func newStream(t testing.TB, f *fake) (*Device, *Stream) {
	t.Helper()
	d, err := f.runtime().Device(1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

// TestCopyBatchDispatch checks that a batch of N block copies is one
// native call where the runtime has cudaMemcpyBatchAsync, with the
// prototype its version defines, and N cudaMemcpyAsync calls elsewhere.
func TestCopyBatchDispatch(t *testing.T) {
	const n = 64
	tests := []struct {
		name      string
		version   int32
		withBatch bool
		form      int // 9, 8, or 0 for the loop
	}{
		{"11.8", 11080, false, 0},
		{"12.6", 12060, false, 0},
		{"12.8", 12080, true, 9},
		{"12.9", 12090, true, 9},
		{"13.0", 13000, true, 8},
		{"13.2", 13020, true, 8},
		{"14.0 unknown", 14000, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(tt.version, tt.withBatch)
			_, s := newStream(t, f)
			cs := blocks(n, 2<<20)
			f.takeTrace()
			if err := s.CopyBatch(HostToDevice, cs); err != nil {
				t.Fatalf("CopyBatch = %v", err)
			}
			if got := f.count("cudaSetDevice"); got != 2 { // NewStream, CopyBatch
				t.Errorf("cudaSetDevice called %d times, want 2 (one per call)", got)
			}
			dsts, srcs, sizes := nonEmpty(cs)
			switch tt.form {
			case 0:
				if got := f.count("cudaMemcpyAsync"); got != n {
					t.Errorf("cudaMemcpyAsync called %d times, want %d", got, n)
				}
				if got := f.count(batchSymbol); got != 0 {
					t.Errorf("%s called %d times, want 0", batchSymbol, got)
				}
				for i, m := range f.memcpys {
					want := memcpyCall{dsts[i], srcs[i], sizes[i], int32(HostToDevice), s.Handle()}
					if m != want {
						t.Fatalf("cudaMemcpyAsync %d = %+v, want %+v", i, m, want)
					}
				}
			default:
				if got := f.count(batchSymbol); got != 1 {
					t.Fatalf("%s called %d times, want 1", batchSymbol, got)
				}
				if got := f.count("cudaMemcpyAsync"); got != 0 {
					t.Errorf("cudaMemcpyAsync called %d times, want 0", got)
				}
				want := batchCall{
					Form: tt.form, Dsts: dsts, Srcs: srcs, Sizes: sizes, Count: n,
					Attrs:   memcpyAttributes{srcAccessOrder: srcAccessOrderStream},
					AttrIdx: 0, NumAttrs: 1, Stream: s.Handle(),
				}
				if diff := cmp.Diff(want, f.batches[0], cmp.AllowUnexported(memcpyAttributes{}, memLocation{})); diff != "" {
					t.Errorf("batch call (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestCopyBatchSmall(t *testing.T) {
	f := newFake(13000, true)
	_, s := newStream(t, f)
	if err := s.CopyBatch(DeviceToHost, nil); err != nil {
		t.Errorf("CopyBatch(nil) = %v", err)
	}
	if err := s.CopyBatch(DeviceToHost, []Copy{{N: 0}, {N: 0}}); err != nil {
		t.Errorf("CopyBatch(empty copies) = %v", err)
	}
	if got := f.count("cudaMemcpyAsync") + f.count(batchSymbol); got != 0 {
		t.Errorf("an empty batch made %d native calls", got)
	}
	// One copy is one cudaMemcpyAsync even where the batch call exists.
	if err := s.CopyToHost([]Copy{{N: 0}, {Dst: 0x10, Src: 0x20, N: 8}}); err != nil {
		t.Fatal(err)
	}
	if f.count("cudaMemcpyAsync") != 1 || f.count(batchSymbol) != 0 || f.memcpys[0].Kind != int32(DeviceToHost) {
		t.Errorf("a batch of one copy: memcpys %+v, batch calls %d", f.memcpys, f.count(batchSymbol))
	}
	if err := s.CopyAsync(DeviceToDevice, 0x30, 0x40, 0); err != nil || f.count("cudaMemcpyAsync") != 1 {
		t.Errorf("CopyAsync of 0 bytes = %v, calls %d", err, f.count("cudaMemcpyAsync"))
	}
	if err := s.CopyAsync(DeviceToDevice, 0x30, 0x40, 16); err != nil {
		t.Fatal(err)
	}
	if got, want := f.memcpys[1], (memcpyCall{0x30, 0x40, 16, int32(DeviceToDevice), s.Handle()}); got != want {
		t.Errorf("CopyAsync = %+v, want %+v", got, want)
	}
}

func TestCopyBatchInvalid(t *testing.T) {
	f := newFake(12080, true)
	_, s := newStream(t, f)
	good := Copy{Dst: 0x100, Src: 0x200, N: 8}
	tests := []struct {
		name   string
		kind   Kind
		copies []Copy
		want   string
	}{
		{"negative size", HostToDevice, []Copy{good, {Dst: 1, Src: 2, N: -1}}, "copy 1: N -1"},
		{"null destination", HostToDevice, []Copy{good, good, {Src: 2, N: 4}}, "copy 2: Dst 0"},
		{"null source", DeviceToHost, []Copy{{Dst: 2, N: 4}}, "copy 0: Src 0"},
		{"bad kind", Kind(9), []Copy{good}, "copy kind 9"},
		{"bad kind, no copies", Kind(-1), nil, "copy kind -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.CopyBatch(tt.kind, tt.copies)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CopyBatch = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if err := s.CopyAsync(HostToDevice, 0, 0x10, 4); err == nil || !strings.Contains(err.Error(), "Dst 0") {
		t.Errorf("CopyAsync to 0 = %v", err)
	}
	if got := f.count("cudaMemcpyAsync") + f.count(batchSymbol); got != 0 {
		t.Errorf("invalid copies made %d native calls, want 0 (nothing enqueued)", got)
	}
}

func TestCopyBatchFailure(t *testing.T) {
	t.Run("loop", func(t *testing.T) {
		f := newFake(11080, false)
		_, s := newStream(t, f)
		f.codes["cudaMemcpyAsync"] = int32(InvalidValue)
		f.memcpyFailAt = 5
		cs := blocks(8, 64) // zero-length copies at indices 4 and 9
		err := s.CopyBatch(HostToDevice, cs)
		if !hasCode(err, InvalidValue) || !strings.Contains(err.Error(), "copy 6 ") {
			t.Errorf("CopyBatch = %v, want InvalidValue at copy 6 (the sixth non-empty one)", err)
		}
		if got := f.count("cudaMemcpyAsync"); got != 6 {
			t.Errorf("cudaMemcpyAsync called %d times, want 6 (stop at the failure)", got)
		}
	})
	t.Run("batch 12.8 with failIdx", func(t *testing.T) {
		f := newFake(12080, true)
		_, s := newStream(t, f)
		f.codes[batchSymbol] = int32(InvalidValue)
		f.batchFailIdx = 5
		err := s.CopyBatch(HostToDevice, blocks(8, 64))
		if !hasCode(err, InvalidValue) || !strings.Contains(err.Error(), "copy 6 ") {
			t.Errorf("CopyBatch = %v, want InvalidValue at copy 6", err)
		}
	})
	t.Run("batch 13.x", func(t *testing.T) {
		f := newFake(13000, true)
		_, s := newStream(t, f)
		f.codes[batchSymbol] = int32(InvalidValue)
		err := s.CopyBatch(HostToDevice, blocks(8, 64))
		if !hasCode(err, InvalidValue) || !strings.Contains(err.Error(), "batch of 10 copies") {
			t.Errorf("CopyBatch = %v, want InvalidValue for the batch", err)
		}
	})
}

// TestCopyBatchOldDriver: a runtime with the batch call on a driver that
// refuses it falls back to the loop, then stays there.
func TestCopyBatchOldDriver(t *testing.T) {
	for _, code := range []Code{CallRequiresNewerDriver, NotSupported} {
		t.Run(code.String(), func(t *testing.T) {
			f := newFake(12080, true)
			d, s := newStream(t, f)
			f.codes[batchSymbol] = int32(code)
			if err := s.CopyBatch(HostToDevice, blocks(16, 64)); err != nil {
				t.Fatalf("CopyBatch = %v, want the loop to succeed", err)
			}
			if f.count(batchSymbol) != 1 || f.count("cudaMemcpyAsync") != 16 {
				t.Errorf("first batch: %d batch calls, %d memcpys, want 1 and 16", f.count(batchSymbol), f.count("cudaMemcpyAsync"))
			}
			if err := s.CopyBatch(HostToDevice, blocks(16, 64)); err != nil {
				t.Fatal(err)
			}
			if f.count(batchSymbol) != 1 || f.count("cudaMemcpyAsync") != 32 {
				t.Errorf("second batch: %d batch calls, %d memcpys, want 1 and 32", f.count(batchSymbol), f.count("cudaMemcpyAsync"))
			}
			if got := d.Runtime().BatchCopy(); got != batchLoop.String() {
				t.Errorf("BatchCopy() = %q after the fallback, want the loop", got)
			}
		})
	}
}

func TestEventQueryAndWait(t *testing.T) {
	f := newFake(12080, true)
	d, s := newStream(t, f)
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitEvent(e); err != nil {
		t.Fatal(err)
	}

	f.readyAfter = 2
	for i, want := range []bool{false, false, true, true} {
		done, err := e.Query()
		if done != want || err != nil {
			t.Errorf("Query() #%d = %v, %v, want %v, nil", i, done, err, want)
		}
	}
	f.codes["cudaEventQuery"] = int32(IllegalAddress)
	if done, err := e.Query(); done || !hasCode(err, IllegalAddress) {
		t.Errorf("Query() = %v, %v, want false and cudaErrorIllegalAddress", done, err)
	}
	delete(f.codes, "cudaEventQuery")

	// Without cancellation: one blocking cudaEventSynchronize, no polling.
	f.queries, f.readyAfter = 0, 1000
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.count("cudaEventSynchronize") != 1 || f.queries != 0 {
		t.Errorf("Wait(Background): %d syncs, %d queries, want 1 and 0", f.count("cudaEventSynchronize"), f.queries)
	}

	// With cancellation: polls until ready.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.queries, f.readyAfter = 0, 100
	if err := e.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if f.queries != 101 {
		t.Errorf("Wait(ctx) made %d queries, want 101 (100 not ready, then ready)", f.queries)
	}

	// Canceled while not ready: returns the context's error.
	f.queries, f.readyAfter = 0, 1<<30
	cancel()
	if err := e.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(canceled) = %v, want context.Canceled", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	if err := e.Wait(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait(deadline) = %v, want context.DeadlineExceeded", err)
	}
	// A failing query ends the wait with its error.
	f.queries, f.readyAfter = 0, 3
	f.codes["cudaEventQuery"] = int32(LaunchFailure)
	if err := e.Wait(context.WithoutCancel(ctx)); err != nil {
		// WithoutCancel has no Done channel: the blocking path.
		t.Errorf("Wait(WithoutCancel) = %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if err := e.Wait(ctx2); !hasCode(err, LaunchFailure) {
		t.Errorf("Wait with a failing query = %v, want cudaErrorLaunchFailure", err)
	}
}

func TestStreamSynchronize(t *testing.T) {
	f := newFake(12080, true)
	_, s := newStream(t, f)
	if err := s.Synchronize(context.Background()); err != nil || f.count("cudaStreamSynchronize") != 1 {
		t.Errorf("Synchronize(Background) = %v, %d syncs", err, f.count("cudaStreamSynchronize"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.readyAfter = 70 // past the spinning rounds, into the timed backoff
	if err := s.Synchronize(ctx); err != nil || f.queries != 71 {
		t.Errorf("Synchronize(ctx) = %v after %d queries, want nil after 71", err, f.queries)
	}
	f.queries, f.readyAfter = 0, 0
	if done, err := s.Query(); !done || err != nil {
		t.Errorf("Query() = %v, %v, want true", done, err)
	}
	f.codes["cudaStreamSynchronize"] = int32(IllegalAddress)
	if err := s.Synchronize(context.Background()); !hasCode(err, IllegalAddress) {
		t.Errorf("Synchronize = %v, want cudaErrorIllegalAddress", err)
	}
}

func TestClose(t *testing.T) {
	f := newFake(12080, true)
	d, s := newStream(t, f)
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close() = %v", err)
		}
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"CopyBatch":   s.CopyBatch(HostToDevice, blocks(2, 8)),
		"CopyAsync":   s.CopyAsync(HostToDevice, 1, 2, 3),
		"Synchronize": s.Synchronize(ctx),
		"WaitEvent":   s.WaitEvent(e),
		"Record":      e.Record(s),
		"Query":       func() error { _, err := s.Query(); return err }(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Stream.%s after Close = %v, want ErrClosed", name, err)
		}
	}
	for range 2 {
		if err := e.Close(); err != nil {
			t.Errorf("Event.Close() = %v", err)
		}
	}
	if _, err := e.Query(); !errors.Is(err, ErrClosed) {
		t.Errorf("Event.Query after Close = %v", err)
	}
	if err := e.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Event.Wait after Close = %v", err)
	}
	if f.count("cudaStreamDestroy") != 1 || f.count("cudaEventDestroy") != 1 || len(f.handles) != 0 {
		t.Errorf("destroys: stream %d, event %d, live handles %v; want 1, 1, none",
			f.count("cudaStreamDestroy"), f.count("cudaEventDestroy"), f.handles)
	}
}

func TestRecordOtherDevice(t *testing.T) {
	f := newFake(12080, true)
	r := f.runtime()
	d0, _ := r.Device(0)
	d1, _ := r.Device(1)
	e, err := d0.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	s, err := d1.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s); err == nil || !strings.Contains(err.Error(), "device 0 on a stream of device 1") {
		t.Errorf("Record across devices = %v, want an error naming both", err)
	}
}

func TestCreateFlags(t *testing.T) {
	f := newFake(12080, true)
	d, _ := newStream(t, f)
	if _, err := d.NewEvent(); err != nil {
		t.Fatal(err)
	}
	tr := strings.Join(f.takeTrace(), " ")
	for _, want := range []string{
		fmt.Sprintf("cudaStreamCreateWithFlags(%d)", streamNonBlocking),
		fmt.Sprintf("cudaEventCreateWithFlags(%d)", eventDisableTiming),
	} {
		if !strings.Contains(tr, want) {
			t.Errorf("trace %q lacks %q", tr, want)
		}
	}
	f.codes["cudaStreamCreateWithFlags"] = int32(MemoryAllocation)
	if _, err := d.NewStream(); !hasCode(err, MemoryAllocation) {
		t.Errorf("NewStream = %v, want cudaErrorMemoryAllocation", err)
	}
}

// TestPinHost: a Stream pins host memory on its own device with
// cudaHostRegister (portable) and unpins it once; the connector's staging
// buffers use it through connector.HostPinner.
func TestPinHost(t *testing.T) {
	f := newFake(12080, true)
	_, s := newStream(t, f)
	if err := s.PinHost(0x7000, 4096); err != nil {
		t.Fatal(err)
	}
	if got := f.count("cudaHostRegister"); got != 1 {
		t.Errorf("PinHost made %d cudaHostRegister calls, want 1", got)
	}
	if err := s.PinHost(0x7000, 4096); err == nil || !strings.Contains(err.Error(), "already pinned") {
		t.Errorf("second PinHost of 0x7000 = %v, want an error saying it is pinned", err)
	}
	if err := s.UnpinHost(0x7000); err != nil {
		t.Fatal(err)
	}
	if got := f.count("cudaHostUnregister"); got != 1 {
		t.Errorf("UnpinHost made %d cudaHostUnregister calls, want 1", got)
	}
	if err := s.UnpinHost(0x7000); err == nil || !strings.Contains(err.Error(), "not pinned") {
		t.Errorf("second UnpinHost = %v, want an error saying it is not pinned", err)
	}
	if err := s.PinHost(0, 10); err == nil {
		t.Errorf("PinHost(0) = nil error")
	}
}
