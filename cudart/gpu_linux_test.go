//go:build linux

package cudart

import (
	"bytes"
	"context"
	"flag"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// requireGPUVar makes the GPU tests fail, instead of skipping, when no
// device is visible.
const requireGPUVar = "CUDART_REQUIRE_GPU"

var bwBytes = flag.Int("cudart.bw-bytes", 256<<20, "bytes copied each way per iteration by BenchmarkPinnedBandwidth (a multiple of 2 MiB)")

// gpuDevice returns device 0, or skips (fails with CUDART_REQUIRE_GPU=1)
// when no GPU is visible.
func gpuDevice(tb testing.TB) *Device {
	tb.Helper()
	rt := openReal(tb)
	n, err := rt.DeviceCount()
	if err != nil || n == 0 {
		if os.Getenv(requireGPUVar) == "1" {
			tb.Fatalf("%s=1 but no GPU is visible: %d devices, %v", requireGPUVar, n, err)
		}
		tb.Skipf("no GPU visible (%d devices, %v); %s=1 makes this a failure", n, err, requireGPUVar)
	}
	d, err := rt.Device(0)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// gpuSetup allocates what a test needs and frees it at the end.
type gpuSetup struct {
	tb testing.TB
	d  *Device
}

func (g gpuSetup) host(n int) *HostBuffer {
	g.tb.Helper()
	h, err := g.d.HostAlloc(n, HostAllocPortable)
	if err != nil {
		g.tb.Fatal(err)
	}
	g.tb.Cleanup(func() {
		if err := h.Free(); err != nil {
			g.tb.Error(err)
		}
	})
	return h
}

func (g gpuSetup) device(n int) *DeviceBuffer {
	g.tb.Helper()
	b, err := g.d.Malloc(n)
	if err != nil {
		g.tb.Fatal(err)
	}
	g.tb.Cleanup(func() {
		if err := b.Free(); err != nil {
			g.tb.Error(err)
		}
	})
	return b
}

func (g gpuSetup) stream() *Stream {
	g.tb.Helper()
	s, err := g.d.NewStream()
	if err != nil {
		g.tb.Fatal(err)
	}
	g.tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			g.tb.Error(err)
		}
	})
	return s
}

func (g gpuSetup) event() *Event {
	g.tb.Helper()
	e, err := g.d.NewEvent()
	if err != nil {
		g.tb.Fatal(err)
	}
	g.tb.Cleanup(func() {
		if err := e.Close(); err != nil {
			g.tb.Error(err)
		}
	})
	return e
}

// fill writes a pattern that differs per seed and per byte position.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*131+i>>9) ^ seed
	}
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func syncCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// TestGPUCopies copies in every direction and checks the bytes: pinned
// host to device, device to device, device to pinned host, host to host,
// and to and from an mmap'd range pinned with cudaHostRegister.
func TestGPUCopies(t *testing.T) {
	d := gpuDevice(t)
	g := gpuSetup{t, d}
	const size = 8 << 20
	src, dst := g.host(size), g.host(size)
	g1, g2 := g.device(size), g.device(size)
	s := g.stream()
	ctx := syncCtx(t)
	fill(src.Bytes(), 1)

	must(t, s.CopyAsync(HostToDevice, g1.Addr(), src.Addr(), size))
	must(t, s.CopyAsync(DeviceToDevice, g2.Addr(), g1.Addr(), size))
	must(t, s.CopyAsync(DeviceToHost, dst.Addr(), g2.Addr(), size))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("host -> device -> device -> host: bytes differ")
	}

	clear(dst.Bytes())
	must(t, s.CopyAsync(HostToHost, dst.Addr(), src.Addr(), size))
	must(t, s.Synchronize(context.Background()))
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("host -> host: bytes differ")
	}

	clear(dst.Bytes())
	must(t, s.CopyAsync(Default, dst.Addr(), g1.Addr(), size))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("device -> host with cudaMemcpyDefault: bytes differ")
	}

	m, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { must(t, syscall.Munmap(m)) }()
	addr := uintptr(unsafe.Pointer(&m[0]))
	reg, err := d.HostRegister(addr, size, HostRegisterPortable)
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.CopyAsync(DeviceToHost, addr, g2.Addr(), size))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(src.Bytes(), m) {
		t.Fatal("device -> registered mmap: bytes differ")
	}
	fill(m, 2)
	must(t, s.CopyAsync(HostToDevice, g1.Addr(), addr, size))
	must(t, s.CopyAsync(DeviceToHost, dst.Addr(), g1.Addr(), size))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(m, dst.Bytes()) {
		t.Fatal("registered mmap -> device -> host: bytes differ")
	}
	if _, err := d.HostRegister(addr, size, 0); !hasCode(err, HostMemoryAlreadyRegistered) {
		t.Errorf("second HostRegister = %v, want cudaErrorHostMemoryAlreadyRegistered", err)
	}
	must(t, reg.Unregister())
}

// TestGPUOrdering checks stream order and an event that orders two
// streams: the second stream reads the device buffer only after the first
// one's copy into it has completed.
func TestGPUOrdering(t *testing.T) {
	d := gpuDevice(t)
	g := gpuSetup{t, d}
	const size = 64 << 20
	a, c, out := g.host(size), g.host(size), g.host(size)
	buf := g.device(size)
	s1, s2 := g.stream(), g.stream()
	e := g.event()
	ctx := syncCtx(t)

	// One stream: the later copy into buf wins.
	fill(a.Bytes(), 3)
	fill(c.Bytes(), 4)
	must(t, s1.CopyAsync(HostToDevice, buf.Addr(), a.Addr(), size))
	must(t, s1.CopyAsync(HostToDevice, buf.Addr(), c.Addr(), size))
	must(t, s1.CopyAsync(DeviceToHost, out.Addr(), buf.Addr(), size))
	must(t, s1.Synchronize(ctx))
	if !bytes.Equal(out.Bytes(), c.Bytes()) {
		t.Fatal("copies on one stream ran out of order")
	}

	// Two streams ordered by an event.
	fill(a.Bytes(), 5)
	clear(out.Bytes())
	must(t, s1.CopyAsync(HostToDevice, buf.Addr(), a.Addr(), size))
	must(t, e.Record(s1))
	must(t, s2.WaitEvent(e))
	must(t, s2.CopyAsync(DeviceToHost, out.Addr(), buf.Addr(), size))
	must(t, e.Wait(ctx))
	if done, err := e.Query(); !done || err != nil {
		t.Errorf("Query() after Wait = %v, %v, want true", done, err)
	}
	must(t, s2.Synchronize(ctx))
	if !bytes.Equal(out.Bytes(), a.Bytes()) {
		t.Fatal("the second stream read the buffer before the event")
	}

	// An event recorded behind pending work is not ready at once, then is.
	must(t, s1.CopyAsync(HostToDevice, buf.Addr(), c.Addr(), size))
	must(t, e.Record(s1))
	done, err := e.Query()
	must(t, err)
	t.Logf("Query() right after recording behind a %d MiB copy = %v", size>>20, done)
	must(t, e.Wait(context.Background()))
	if done, err := e.Query(); !done || err != nil {
		t.Errorf("Query() after Wait = %v, %v", done, err)
	}
}

// TestGPUBatch copies 257 blocks, with empty copies among them, to scattered
// device slots and back with CopyBatch on the installed runtime's path.
func TestGPUBatch(t *testing.T) {
	d := gpuDevice(t)
	g := gpuSetup{t, d}
	t.Logf("runtime %s: batch copy uses %s", d.Runtime().File(), d.Runtime().BatchCopy())
	const n, bs = 257, 64 << 10
	src, dst := g.host(n*bs), g.host(n*bs)
	buf, buf2 := g.device(n*bs), g.device(n*bs)
	s := g.stream()
	fill(src.Bytes(), 6)
	slot := func(i int) int { return (i * 97) % n } // a permutation: 97 and 257 are coprime
	var up, across, down []Copy
	for i := range n {
		up = append(up, Copy{Dst: buf.Addr() + uintptr(slot(i)*bs), Src: src.Addr() + uintptr(i*bs), N: bs})
		across = append(across, Copy{Dst: buf2.Addr() + uintptr(i*bs), Src: buf.Addr() + uintptr(i*bs), N: bs})
		down = append(down, Copy{Dst: dst.Addr() + uintptr(i*bs), Src: buf2.Addr() + uintptr(slot(i)*bs), N: bs})
		if i%50 == 0 {
			up = append(up, Copy{})
		}
	}
	must(t, s.CopyToDevice(up))
	must(t, s.CopyBatch(DeviceToDevice, across))
	must(t, s.CopyToHost(down))
	must(t, s.Synchronize(syncCtx(t)))
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("batched copies: bytes differ")
	}
}

// BenchmarkPinnedBandwidth compares, each way between pinned host memory
// and the device, one large copy with the same bytes as a batch of 2 MiB
// block copies, interleaved in every iteration. blocks/large is the ratio
// of their bandwidths (the target is 0.9 or more).
func BenchmarkPinnedBandwidth(b *testing.B) {
	d := gpuDevice(b)
	g := gpuSetup{b, d}
	const block = 2 << 20
	total := *bwBytes / block * block
	if total == 0 {
		b.Fatalf("-cudart.bw-bytes=%d: want at least %d", *bwBytes, block)
	}
	host, dev := g.host(total), g.device(total)
	s := g.stream()
	fill(host.Bytes(), 7)
	b.Logf("%d MiB each way, %d blocks of 2 MiB; batch copy uses %s", total>>20, total/block, d.Runtime().BatchCopy())
	for _, dir := range []struct {
		name     string
		kind     Kind
		dst, src uintptr
	}{{"H2D", HostToDevice, dev.Addr(), host.Addr()}, {"D2H", DeviceToHost, host.Addr(), dev.Addr()}} {
		b.Run(dir.name, func(b *testing.B) {
			copies := make([]Copy, total/block)
			for i := range copies {
				off := uintptr(i * block)
				copies[i] = Copy{Dst: dir.dst + off, Src: dir.src + off, N: block}
			}
			run := func(f func() error) time.Duration {
				start := time.Now()
				must(b, f())
				must(b, s.Synchronize(context.Background()))
				return time.Since(start)
			}
			large := func() error { return s.CopyAsync(dir.kind, dir.dst, dir.src, total) }
			batch := func() error { return s.CopyBatch(dir.kind, copies) }
			run(large) // warm up
			run(batch)
			var tLarge, tBlocks time.Duration
			for b.Loop() {
				tLarge += run(large)
				tBlocks += run(batch)
			}
			gbps := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
			b.ReportMetric(gbps(tLarge), "large-GB/s")
			b.ReportMetric(gbps(tBlocks), "blocks-GB/s")
			b.ReportMetric(tLarge.Seconds()/tBlocks.Seconds(), "blocks/large")
		})
	}
}
