//go:build linux

package mooncake

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
)

// TestLayoutMatchesC compares the Go structs with the C compiler's layout
// of the header's structs.
func TestLayoutMatchesC(t *testing.T) {
	h := fakeHooks(t)
	h.layout(h.scratchAddr)
	got := words(h.scratch.Bytes()[:56])
	want := []uint64{requestSize, 8, 16, 24, 32, statusSize, 8}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("C layout (sizeof request, offsets of source, target_id, target_offset, length, sizeof status, offset of transferred_bytes) (-want +got):\n%s", diff)
	}
	if err := checkLayout(); err != nil {
		t.Errorf("checkLayout() = %v", err)
	}
}

func TestOpenUnavailable(t *testing.T) {
	lib := needFake(t)
	notTE, err := gcc(t.TempDir(), "libnotte.so", "-x", "c", "/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"missing file", Config{Library: "/nonexistent/libtransfer_engine.so", Hostname: "127.0.0.1"}, "BUILD_SHARED_LIBS=ON"},
		{"not a transfer engine", Config{Library: notTE, Hostname: "127.0.0.1"}, "not a Mooncake Transfer Engine C library"},
		{"create fails", Config{Library: lib, Hostname: "127.0.0.1", Metadata: "fake:fail"}, "createTransferEngine"},
	} {
		_, err := Open(ctx, tc.cfg)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Open = %v, want ErrUnavailable mentioning %q", tc.name, err, tc.want)
		}
	}
	t.Setenv(EnvLibrary, "/nonexistent/dir/libtransfer_engine.so")
	if _, err := Open(ctx, Config{Hostname: "127.0.0.1"}); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), EnvLibrary) {
		t.Errorf("Open with %s set to a missing file = %v, want ErrUnavailable naming the variable", EnvLibrary, err)
	}
	t.Setenv(EnvLibrary, filepath.Dir(lib))
	e, err := Open(ctx, Config{Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatalf("Open with %s set to the fake's folder = %v", EnvLibrary, err)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Open(canceled, Config{Library: lib, Hostname: "127.0.0.1"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Open(canceled) = %v, want context.Canceled", err)
	}
	if _, err := Open(ctx, Config{Library: lib}); err == nil || !strings.Contains(err.Error(), "Hostname") {
		t.Errorf("Open without a hostname = %v, want an error naming Hostname", err)
	}
}

func TestOpenTransports(t *testing.T) {
	h := fakeHooks(t)
	tcp := openFake(t, nil)
	if got := h.cstr(func(b, n uintptr) { h.transport(tcp.handle, b, n) }); got != "tcp|" {
		t.Errorf("tcp engine's transport = %q, want %q", got, "tcp|")
	}
	if got := tcp.Segment(); !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("Segment() with P2PHANDSHAKE = %q, want 127.0.0.1:port", got)
	}

	rdmaEng := openFake(t, func(c *Config) { c.Protocol = "RDMA"; c.Devices = []string{"mlx5_0", "mlx5_1"} })
	got := h.cstr(func(b, n uintptr) { h.transport(rdmaEng.handle, b, n) })
	proto, matrix, _ := strings.Cut(got, "|")
	if proto != "rdma" {
		t.Errorf("rdma engine's transport = %q, want rdma", proto)
	}
	var m map[string][2][]string
	if err := json.Unmarshal([]byte(matrix), &m); err != nil {
		t.Fatalf("the NIC priority matrix handed to installTransport is not the expected JSON: %v\n%s", err, matrix)
	}
	for _, loc := range []string{"cpu:0", "cpu:1", "cuda:0", "cuda:7"} {
		if diff := cmp.Diff([2][]string{{"mlx5_0", "mlx5_1"}, {}}, m[loc]); diff != "" {
			t.Errorf("matrix[%q] (-want +got):\n%s", loc, diff)
		}
	}
	raw := `{"cpu:0": [["mlx5_2"], []]}`
	custom := openFake(t, func(c *Config) { c.Protocol = "rdma"; c.NICPriorityMatrix = raw })
	if got := h.cstr(func(b, n uintptr) { h.transport(custom.handle, b, n) }); got != "rdma|"+raw {
		t.Errorf("transport with a NIC priority matrix = %q, want %q", got, "rdma|"+raw)
	}

	auto := openFake(t, func(c *Config) { c.AutoDiscover = true })
	if s := h.statsOf(auto); s.AutoDiscover != 1 {
		t.Errorf("auto_discover passed = %d, want 1", s.AutoDiscover)
	}
	if got := h.cstr(func(b, n uintptr) { h.transport(auto.handle, b, n) }); got != "|" {
		t.Errorf("AutoDiscover engine installed transport %q, want none", got)
	}

	named := openFake(t, func(c *Config) { c.Metadata = "http://127.0.0.1:8080/metadata"; c.Hostname = "node7" })
	if got := named.Segment(); got != "node7" {
		t.Errorf("Segment() with a metadata service = %q, want the hostname node7", got)
	}
}

func TestRegisterLocations(t *testing.T) {
	h := fakeHooks(t)
	e := openFake(t, func(c *Config) { c.DeviceMemory = true })
	m := alloc(t, 8192, 0)
	r := m.Region()
	if err := e.Register(r); err != nil {
		t.Fatal(err)
	}
	if got := h.cstr(func(b, n uintptr) { h.location(e.handle, r.Addr, b, n) }); got != "cpu:0" {
		t.Errorf("host memory registered as %q, want cpu:0", got)
	}
	dev := rdma.Region{Addr: 0x7f0000000000, Len: 1 << 20, Loc: rdma.Device(1)}
	if err := e.Register(dev); err != nil {
		t.Fatalf("Register(device) with DeviceMemory = %v", err)
	}
	if got := h.cstr(func(b, n uintptr) { h.location(e.handle, dev.Addr, b, n) }); got != "cuda:1" {
		t.Errorf("device memory registered as %q, want cuda:1", got)
	}
	numa := openFake(t, func(c *Config) { c.HostLocation = "*" })
	if err := numa.Register(r); err != nil {
		t.Fatal(err)
	}
	if got := h.cstr(func(b, n uintptr) { h.location(numa.handle, r.Addr, b, n) }); got != "*" {
		t.Errorf("host memory with HostLocation * registered as %q", got)
	}

	// Unmapped memory never reaches the library.
	before := h.statsOf(numa).Regions
	freed, err := rdma.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	fr := freed.Region()
	if err := freed.Free(); err != nil {
		t.Fatal(err)
	}
	if err := numa.Register(fr); !errors.Is(err, rdma.ErrInvalidRegion) {
		t.Errorf("Register(unmapped) = %v, want ErrInvalidRegion", err)
	}
	if got := h.statsOf(numa).Regions; got != before {
		t.Errorf("native regions after refusing unmapped memory = %d, want %d", got, before)
	}
}

// enginePair returns two fake engines, each with 1 MiB of registered
// memory, and a's handle of b's segment.
func enginePair(t *testing.T) (a, b *Engine, am, bm *rdma.HostMemory, seg rdma.SegmentID) {
	t.Helper()
	a, b = openFake(t, nil), openFake(t, nil)
	am, bm = alloc(t, 1<<20, 1), alloc(t, 1<<20, 2)
	if err := a.Register(am.Region()); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(bm.Region()); err != nil {
		t.Fatal(err)
	}
	seg, err := a.Open(context.Background(), b.Segment())
	if err != nil {
		t.Fatal(err)
	}
	return a, b, am, bm, seg
}

func reads(am, bm *rdma.HostMemory, seg rdma.SegmentID, n, size int) []rdma.Request {
	reqs := make([]rdma.Request, n)
	for i := range reqs {
		reqs[i] = rdma.Request{Op: rdma.Read, Local: rdma.Region{Addr: am.Region().Addr + uintptr(i*size), Len: size, Loc: rdma.Host}, Segment: seg, Remote: bm.Region().Addr + uintptr(i*size)}
	}
	return reqs
}

// TestNativeCalls counts the native calls of a batch: one allocation, one
// submit for all its requests, one status per request, one free; and
// checks that the request array handed to native code is the batch's
// memory outside the Go heap.
func TestNativeCalls(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	const n = 256
	before := h.statsOf(a)
	batch, err := a.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, n, 64)); err != nil {
		t.Fatal(err)
	}
	b := batch.(*Batch)
	entries := uintptr(h.lastEntries(a.handle))
	if lo, hi := b.ar.base, b.ar.base+uintptr(len(b.ar.buf)); entries < lo || entries >= hi {
		t.Errorf("submitTransfer got entries at %#x, outside the batch's arena [%#x, %#x)", entries, lo, hi)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	after := h.statsOf(a)
	got := fakeStats{
		Submit: after.Submit - before.Submit, Status: after.Status - before.Status,
		Alloc: after.Alloc - before.Alloc, Free: after.Free - before.Free,
		Violations: after.Violations, Live: after.Live,
	}
	want := fakeStats{Submit: 1, Status: n, Alloc: 1, Free: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("native calls for a batch of %d (-want +got):\n%s", n, diff)
	}
	for i := range n {
		if r := batch.Result(i); r.Status != rdma.Completed || r.Bytes != 64 {
			t.Fatalf("request %d = %+v", i, r)
		}
	}
}

// TestHeldRequests checks the life of a batch whose requests are in
// flight: not done, not releasable, its memory not unregistrable, Wait
// honoring its context; then done, released and freed exactly once.
func TestHeldRequests(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	h.hold(a.handle, 1, 0)
	batch, err := a.NewBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 4, 1024)); err != nil {
		t.Fatal(err)
	}
	if done, err := batch.Poll(); done || err != nil {
		t.Errorf("Poll with held requests = %v, %v, want false, nil", done, err)
	}
	if r := batch.Result(0); r.Status != rdma.Pending {
		t.Errorf("Result(0) while held = %+v, want pending", r)
	}
	if err := batch.Release(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Release while held = %v, want ErrBusy", err)
	}
	if err := a.Unregister(am.Region()); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Unregister of memory held requests use = %v, want ErrBusy", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := batch.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait(1 ms) while held = %v, want DeadlineExceeded", err)
	}
	if s := h.statsOf(a); s.Free != 0 || s.Live != 1 {
		t.Errorf("frees %d, live %d while held, want 0, 1", s.Free, s.Live)
	}
	h.hold(a.handle, 0, 0)
	if n := h.release(a.handle); n != 4 {
		t.Fatalf("fake_release ran %d tasks, want 4", n)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if r := batch.Result(i); r.Status != rdma.Completed || r.Bytes != 1024 {
			t.Errorf("request %d = %+v, want completed", i, r)
		}
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if s := h.statsOf(a); s.Free != 1 || s.Live != 0 {
		t.Errorf("frees %d, live %d after two Releases, want 1, 0", s.Free, s.Live)
	}
	if err := a.Unregister(am.Region()); err != nil {
		t.Errorf("Unregister after the batch = %v", err)
	}
}

// TestTimedOutRequests checks requests Mooncake reports TIMEOUT (with
// MC_SLICE_TIMEOUT) but has not finished: they stay pending, their batch
// cannot be released nor their memory unregistered, until Mooncake
// finishes them; one that then fails is reported timed out, one that then
// completes, completed.
func TestTimedOutRequests(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	h.hold(a.handle, 1, 1)
	batch, err := a.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	reqs := reads(am, bm, seg, 2, 512)
	// Request 0 crosses the end of the peer's memory: it fails when it
	// runs. (Polls stop at the first request in flight: only it is seen
	// timed out.)
	reqs[0].Remote = bm.Region().End() - 100
	if err := batch.Submit(reqs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := batch.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait(20 ms) while Mooncake reports TIMEOUT = %v, want DeadlineExceeded", err)
	}
	for i := range 2 {
		if r := batch.Result(i); r.Status != rdma.Pending {
			t.Errorf("request %d while Mooncake reports TIMEOUT = %+v, want pending", i, r)
		}
	}
	if err := batch.Release(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Release of timed-out, unfinished requests = %v, want ErrBusy", err)
	}
	if s := h.statsOf(a); s.Free != 0 {
		t.Errorf("the batch was freed while Mooncake still runs its requests")
	}
	if err := a.Unregister(am.Region()); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Unregister of memory unfinished timed-out requests use = %v, want ErrBusy", err)
	}
	h.hold(a.handle, 0, 0)
	h.release(a.handle)
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := batch.Result(0); r.Status != rdma.Timeout {
		t.Errorf("request 0, timed out then failed = %+v, want timeout", r)
	}
	if r := batch.Result(1); r.Status != rdma.Completed || r.Bytes != 512 {
		t.Errorf("request 1, completed = %+v, want completed with 512 bytes", r)
	}
	if err := batch.Release(); err != nil {
		t.Fatalf("Release once Mooncake finished = %v", err)
	}
	if s := h.statsOf(a); s.Free != 1 || s.Live != 0 {
		t.Errorf("frees %d, live %d after Release, want 1, 0", s.Free, s.Live)
	}
	if done, err := batch.Poll(); !done || err != nil {
		t.Errorf("Poll after Release of a final batch = %v, %v, want true, nil", done, err)
	}
	if err := a.Unregister(am.Region()); err != nil {
		t.Errorf("Unregister once Mooncake finished = %v", err)
	}
}

// TestSubmitFailsAfterQueuing covers a transport that fails after Mooncake
// queued the tasks: Submit reports the error, and the tasks stay in the
// batch to be polled and freed.
func TestSubmitFailsAfterQueuing(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	h.failSubmit(a.handle, 102)
	batch, err := a.NewBatch(3)
	if err != nil {
		t.Fatal(err)
	}
	err = batch.Submit(reads(am, bm, seg, 3, 100))
	if e, ok := errors.AsType[Error](err); !ok || e.Code != CodeSocket || e.Op != opSubmit {
		t.Errorf("Submit with a failing transport = %v, want Error{submit, SOCKET}", err)
	}
	h.failSubmit(a.handle, 0)
	if n := batch.Len(); n != 3 {
		t.Errorf("Len() after a submit Mooncake queued then failed = %d, want 3", n)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := batch.Result(i); r.Status != rdma.Failed {
			t.Errorf("request %d = %+v, want failed", i, r)
		}
	}
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if s := h.statsOf(a); s.Live != 0 {
		t.Errorf("live batches = %d, want 0", s.Live)
	}
	// A refusal before queuing (too many requests, checked in Go first)
	// never reaches the library.
	before := h.statsOf(a).Submit
	small, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := small.Submit(reads(am, bm, seg, 2, 8)); !errors.Is(err, rdma.ErrBatchFull) {
		t.Errorf("Submit(2) to a batch of 1 = %v, want ErrBatchFull", err)
	}
	if got := h.statsOf(a).Submit; got != before {
		t.Errorf("native submits after a refused Submit = %d, want %d", got, before)
	}
	if err := small.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseFreesEverything closes an engine with batches never polled nor
// released: Close polls them, frees them and destroys the engine.
func TestCloseFreesEverything(t *testing.T) {
	h := fakeHooks(t)
	batches0, engines0 := h.live()
	a, b := openFake(t, nil), openFake(t, nil)
	am, bm := alloc(t, 4096, 0), alloc(t, 4096, 0)
	if err := a.Register(am.Region()); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(bm.Region()); err != nil {
		t.Fatal(err)
	}
	seg, err := a.Open(context.Background(), b.Segment())
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		batch, err := a.NewBatch(2)
		if err != nil {
			t.Fatal(err)
		}
		if err := batch.Submit(reads(am, bm, seg, 2, 64)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.NewBatch(5); err != nil { // empty, never used
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if batches, engines := h.live(); batches != batches0 || engines != engines0 {
		t.Errorf("after Close: %d live batches, %d engines, want %d, %d", batches, engines, batches0, engines0)
	}
}

// TestCloseTimeout closes an engine whose requests never finish: Close
// gives up after CloseTimeout, leaves the native engine in place, and
// says so.
func TestCloseTimeout(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	a.cfg.CloseTimeout = 20 * time.Millisecond
	h.hold(a.handle, 1, 0)
	batch, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 1, 64)); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, ErrCloseTimeout) {
		t.Errorf("Close with a request that never ends = %v, want ErrCloseTimeout", err)
	}
	// The native engine still exists (the fake aborts on a destroyed one).
	if s := h.statsOf(a); s.Live != 1 {
		t.Errorf("live batches of the abandoned engine = %d, want 1", s.Live)
	}
	h.release(a.handle)
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		err  Error
		want error
		name string
	}{
		{Error{opRegister, CodeAddressOverlapped}, rdma.ErrRegistered, "ADDRESS_OVERLAPPED"},
		{Error{opUnregister, CodeAddressNotRegistered}, rdma.ErrNotRegistered, "ADDRESS_NOT_REGISTERED"},
		{statusError(opSubmit, 2), rdma.ErrBatchFull, "TOO_MANY_REQUESTS"},
		{statusError(opFree, 4), rdma.ErrBusy, "BATCH_BUSY"},
		{statusError(opSubmit, 1), rdma.ErrInvalidRequest, "INVALID_ARGUMENT"},
		{Error{opOpen, CodeInvalidArgument}, rdma.ErrUnknownSegment, "INVALID_ARGUMENT"},
		{Error{opOpen, CodeSocket}, rdma.ErrUnknownSegment, "SOCKET"},
		{Error{opTransport, CodeDeviceNotFound}, ErrUnavailable, "DEVICE_NOT_FOUND"},
		{statusError(opStatus, 999), nil, "NOT_IMPLEMENTED"},
	} {
		if tc.want != nil && !errors.Is(tc.err, tc.want) {
			t.Errorf("%v does not match %v", tc.err, tc.want)
		}
		if tc.want == nil && tc.err.Unwrap() != nil {
			t.Errorf("%v unwraps to %v, want nil", tc.err, tc.err.Unwrap())
		}
		if got := tc.err.Name(); got != tc.name {
			t.Errorf("%v.Name() = %q, want %q", tc.err, got, tc.name)
		}
		if !strings.Contains(tc.err.Error(), tc.name) {
			t.Errorf("%q does not name %s", tc.err.Error(), tc.name)
		}
	}
	if got := (Error{opSubmit, -4242}).Error(); got != "mooncake: submit: code -4242" {
		t.Errorf("unknown code = %q", got)
	}
}

// TestTimeoutIsNotFinal follows a caller that reuses a block once its read
// is final and not completed: Mooncake reports TIMEOUT for a task that
// outlived MC_SLICE_TIMEOUT and then still moves its bytes. Such a task is
// not final: Wait does not return, Release and Unregister are refused, and
// the block holds whatever the caller writes after Wait returned.
func TestTimeoutIsNotFinal(t *testing.T) {
	h := fakeHooks(t)
	a, _, am, bm, seg := enginePair(t)
	h.late(a.handle, 3)
	batch, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reads(am, bm, seg, 1, 512)); err != nil {
		t.Fatal(err)
	}
	block := am.Bytes()[:512]
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := batch.Wait(ctx); err == nil {
		// Final: a caller recomputes a block that did not arrive, or
		// frees it and lets another request write it.
		r := batch.Result(0)
		if r.Status != rdma.Completed {
			fill(block, 0xEE)
		}
		if err := batch.Release(); err != nil {
			t.Fatalf("Release after Wait = %v", err)
		}
		next, err := a.NewBatch(1) // polls released batches, as later calls do
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Release(); err != nil {
			t.Fatal(err)
		}
		if r.Status != rdma.Completed && block[0] != 0xEE {
			t.Fatalf("Wait returned with request 0 %v; the caller wrote the block, and the transfer wrote it afterwards (byte 0 = %#x)", r.Status, block[0])
		}
		return
	}
	if r := batch.Result(0); r.Status != rdma.Pending {
		t.Errorf("Result(0) while Mooncake reports TIMEOUT and the task runs on = %+v, want pending", r)
	}
	if err := batch.Release(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Release while a timed-out task runs on = %v, want ErrBusy", err)
	}
	if err := a.Unregister(am.Region()); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Unregister of memory a timed-out task still writes = %v, want ErrBusy", err)
	}
	if err := batch.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := batch.Result(0); r.Status != rdma.Completed || r.Bytes != 512 {
		t.Errorf("Result(0) once the late task ran = %+v, want completed with 512 bytes", r)
	}
	if block[0] != 2 {
		t.Errorf("byte 0 of the block after the late read = %#x, want the peer's 0x2", block[0])
	}
	fill(block, 0xEE)
	if err := batch.Release(); err != nil {
		t.Fatal(err)
	}
	if s := h.statsOf(a); s.Free != 1 || s.Live != 0 {
		t.Errorf("frees %d, live %d after Release, want 1, 0", s.Free, s.Live)
	}
	if block[0] != 0xEE {
		t.Errorf("the block changed after its request settled")
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}
