//go:build linux

package cudacopy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/cudart"
	"github.com/kvconnect/kvconnect/internal/fakelib"
)

// requireVar makes the tests that need a CUDA runtime fail, instead of
// skipping, when they cannot have one: the fake that gcc builds, or the
// real library. CI sets it.
const requireVar = "CUDART_REQUIRE"

var fake *fakelib.Lib

func TestMain(m *testing.M) {
	// cudart's stand-in for libcudart: copies run at once over malloc'd
	// "device" memory, with the real prototypes and a thread-local current
	// device. It exports no batch call: each copy is a cudaMemcpyAsync.
	fake = fakelib.Build("libcudart.so.12", []string{"../../cudart/testdata/fakecudart.c"}, "-Wno-unused-parameter")
	code := m.Run()
	if err := fake.Remove(); err != nil && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// fakeDevice opens the fake runtime and returns its device 0.
func fakeDevice(t *testing.T) *cudart.Device {
	t.Helper()
	t.Setenv(cudart.PathVar, fake.Need(t, requireVar))
	rt, err := cudart.Open()
	if err != nil {
		t.Fatalf("cudart.Open(fake) = %v", err)
	}
	d, err := rt.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// rig is a Copier on the fake device, with host and "device" memory of
// n blocks of size bytes each.
type rig struct {
	t    *testing.T
	c    *Copier
	host *cudart.HostBuffer
	dev  *cudart.DeviceBuffer
	size int
}

func newRig(t *testing.T, n, size int) *rig {
	t.Helper()
	d := fakeDevice(t)
	c, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	host, err := d.HostAlloc(n*size, cudart.HostAllocPortable)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := d.Malloc(n * size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range []error{c.Close(), host.Free(), dev.Free()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	for i := range host.Bytes() {
		host.Bytes()[i] = byte(i*31 + i>>8)
	}
	return &rig{t: t, c: c, host: host, dev: dev, size: size}
}

// toDevice returns the copies of host blocks from to device blocks to.
func (r *rig) toDevice(from, to []int) []connector.DeviceCopy {
	var cs []connector.DeviceCopy
	for i := range from {
		cs = append(cs, connector.DeviceCopy{Dst: r.dev.Addr() + uintptr(to[i]*r.size), Src: r.host.Addr() + uintptr(from[i]*r.size), N: r.size})
	}
	return cs
}

// toHost returns the copies of device blocks from to host blocks to.
func (r *rig) toHost(from, to []int) []connector.DeviceCopy {
	cs := r.toDevice(to, from)
	for i := range cs {
		cs[i].Dst, cs[i].Src = cs[i].Src, cs[i].Dst
	}
	return cs
}

func (r *rig) block(i int) []byte { return r.host.Bytes()[i*r.size : (i+1)*r.size] }

func (r *rig) streams() int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return len(r.c.mu.all)
}

func wait(t *testing.T, done connector.CopyCompletion) {
	t.Helper()
	if err := done.Wait(context.Background()); err != nil {
		t.Fatalf("Wait() = %v", err)
	}
}

func stream(done connector.CopyCompletion) uintptr { return done.(*batch).l.s.Handle() }

// TestRoundTrip: copies to the device and back, each batch waited for,
// move every byte, on the one stream New made.
func TestRoundTrip(t *testing.T) {
	r := newRig(t, 8, 4096)
	want := bytes.Clone(r.host.Bytes()[:4*r.size])
	done, err := r.c.CopyToDevice(r.toDevice([]int{0, 1, 2, 3}, []int{3, 2, 1, 0}))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, done)
	wait(t, done) // a second Wait returns at once
	done, err = r.c.CopyToHost(r.toHost([]int{3, 2, 1, 0}, []int{4, 5, 6, 7}))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, done)
	if got := r.host.Bytes()[4*r.size:]; !bytes.Equal(got, want) {
		t.Error("host -> device -> host: the bytes differ")
	}
	if n := r.streams(); n != 1 {
		t.Errorf("%d streams for batches waited for one after the other, want 1", n)
	}
}

// TestStreamPerBatch: batches in flight at once run on streams of their
// own, and a stream whose batch completed serves the next batch.
func TestStreamPerBatch(t *testing.T) {
	r := newRig(t, 4, 512)
	a, err := r.c.CopyToDevice(r.toDevice([]int{0}, []int{0}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.c.CopyToHost(r.toHost([]int{1}, []int{1}))
	if err != nil {
		t.Fatal(err)
	}
	if stream(a) == stream(b) {
		t.Fatalf("two batches in flight share stream %#x: waiting for one would wait for the other", stream(a))
	}
	wait(t, b)
	c, err := r.c.CopyToDevice(r.toDevice([]int{2}, []int{2}))
	if err != nil {
		t.Fatal(err)
	}
	if stream(c) == stream(a) {
		t.Errorf("a batch was issued on stream %#x, whose batch had not been waited for", stream(a))
	}
	wait(t, a)
	wait(t, c)
	if n := r.streams(); n != 2 {
		t.Errorf("%d streams for at most two batches in flight, want 2", n)
	}
}

// TestPartialFailure: a batch the runtime rejects part-way returns its
// error with a completion for the copies it did issue; they land, the
// rest do not, and the stream serves later batches.
func TestPartialFailure(t *testing.T) {
	r := newRig(t, 8, 256)
	clear(r.host.Bytes()[4*r.size:])
	zero, err := r.c.CopyToDevice(r.toDevice([]int{4, 5, 6, 7}, []int{0, 1, 2, 3}))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, zero)
	cs := r.toDevice([]int{0, 1, 2, 3}, []int{0, 1, 2, 3})
	cs[2].Src = cs[2].Dst // the fake rejects a copy onto itself
	done, err := r.c.CopyToDevice(cs)
	if err == nil || !strings.Contains(err.Error(), "copy 2") {
		t.Fatalf("CopyToDevice with copy 2 rejected = %v, want an error naming copy 2", err)
	}
	if done == nil {
		t.Fatal("CopyToDevice failed part-way without a completion for the copies it issued")
	}
	wait(t, done)
	back, err := r.c.CopyToHost(r.toHost([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, back)
	zeros := make([]byte, r.size)
	for i, want := range [][]byte{r.block(0), r.block(1), zeros, zeros} {
		what := "issued before the rejected copy"
		if i >= 2 {
			what = "the rejected copy or one after it, never issued"
		}
		if !bytes.Equal(r.block(4+i), want) {
			t.Errorf("device block %d: not what copy %d, %s, leaves", i, i, what)
		}
	}
	if n := r.streams(); n != 1 {
		t.Errorf("%d streams, want 1: the stream of the failed batch serves again once waited for", n)
	}
}

// TestPins: PinHost and UnpinHost pair up per range; Close unpins what
// is left.
func TestPins(t *testing.T) {
	r := newRig(t, 2, 4096)
	a, b := r.host.Addr(), r.host.Addr()+4096
	for _, addr := range []uintptr{a, b} {
		if err := r.c.PinHost(addr, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.c.PinHost(a, 4096); err == nil || !strings.Contains(err.Error(), "already pinned") {
		t.Errorf("second PinHost = %v, want an error saying it is pinned", err)
	}
	if err := r.c.UnpinHost(a); err != nil {
		t.Fatal(err)
	}
	if err := r.c.UnpinHost(a); err == nil || !strings.Contains(err.Error(), "not pinned") {
		t.Errorf("second UnpinHost = %v, want an error saying it is not pinned", err)
	}
	if err := r.c.Close(); err != nil {
		t.Fatal(err)
	}
	if r.c.pins.m != nil {
		t.Errorf("Close left %d ranges pinned", len(r.c.pins.m))
	}
}

// TestClose: after Close, copies fail with cudart.ErrClosed and no
// completion, Wait of a batch in flight reports it, and Close again
// returns nil.
func TestClose(t *testing.T) {
	r := newRig(t, 2, 256)
	done, err := r.c.CopyToDevice(r.toDevice([]int{0}, []int{0}))
	if err != nil {
		t.Fatal(err)
	}
	waited, err := r.c.CopyToDevice(r.toDevice([]int{1}, []int{1}))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, waited)
	for range 2 {
		if err := r.c.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	}
	if d, err := r.c.CopyToHost(r.toHost([]int{0}, []int{0})); d != nil || !errors.Is(err, cudart.ErrClosed) {
		t.Errorf("CopyToHost after Close = %v, %v; want no completion and cudart.ErrClosed", d, err)
	}
	if err := done.Wait(context.Background()); !errors.Is(err, cudart.ErrClosed) {
		t.Errorf("Wait of a batch in flight at Close = %v, want cudart.ErrClosed", err)
	}
	if err := done.Wait(context.Background()); !errors.Is(err, cudart.ErrClosed) {
		t.Errorf("second Wait = %v, want the same error", err)
	}
	if err := waited.Wait(context.Background()); err != nil {
		t.Errorf("Wait after Close of a batch that completed before = %v, want nil", err)
	}
}

// TestConcurrent: goroutines that copy and wait at once, as a worker's
// transfer goroutines do, each get their bytes back, on no more streams
// than there are goroutines.
func TestConcurrent(t *testing.T) {
	const goroutines, rounds = 4, 50
	r := newRig(t, 2*goroutines, 1024)
	want := bytes.Clone(r.host.Bytes())
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for range rounds {
				done, err := r.c.CopyToDevice(r.toDevice([]int{g}, []int{g}))
				if err == nil {
					err = done.Wait(context.Background())
				}
				if err == nil {
					done, err = r.c.CopyToHost(r.toHost([]int{g}, []int{goroutines + g}))
				}
				if err == nil {
					err = done.Wait(context.Background())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for g := range goroutines {
		if !bytes.Equal(r.block(goroutines+g), want[g*r.size:(g+1)*r.size]) {
			t.Errorf("goroutine %d: the bytes that came back differ", g)
		}
	}
	if n := r.streams(); n > goroutines {
		t.Errorf("%d streams for %d goroutines", n, goroutines)
	}
}
