//go:build linux

package cudacopy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/cudart"
)

// requireGPUVar makes the GPU test fail, instead of skipping, when no
// device is visible (scripts/gpu-check.sh sets it).
const requireGPUVar = "CUDART_REQUIRE_GPU"

// gpuDevice returns device 0 of the real runtime, or skips: without the
// library (a failure under CUDART_REQUIRE=1) or without a GPU (a failure
// under CUDART_REQUIRE_GPU=1).
func gpuDevice(t *testing.T) *cudart.Device {
	t.Helper()
	rt, err := cudart.Open()
	if err != nil {
		if os.Getenv(requireVar) == "1" {
			t.Fatalf("%s=1 but the CUDA runtime did not load: %v", requireVar, err)
		}
		t.Skipf("CUDA runtime not loaded (%s=1 makes this a failure): %v", requireVar, err)
	}
	d, err := rt.Device(0)
	if err != nil {
		if cudart.IsNoGPU(err) && os.Getenv(requireGPUVar) != "1" {
			t.Skipf("no GPU visible (%s=1 makes this a failure): %v", requireGPUVar, err)
		}
		t.Fatal(err)
	}
	return d
}

// TestGPU: on a GPU, two goroutines stage blocks through mmap'd host
// memory pinned with PinHost, to device memory and back, each batch on a
// stream of its own, and every byte comes back.
func TestGPU(t *testing.T) {
	d := gpuDevice(t)
	const goroutines, blocks, size = 2, 64, 64 << 10
	c, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	dev, err := d.Malloc(goroutines * blocks * size)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dev.Free(); err != nil {
			t.Error(err)
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Go(func() { errs[g] = roundTrip(c, dev.Addr()+uintptr(g*blocks*size), blocks, size, byte(g)) })
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: %v", g, err)
		}
	}
}

// roundTrip copies blocks blocks of size bytes from pinned mmap'd memory
// to the device memory at dev, in reverse order, and back, and compares.
// It waits without cancellation, as a worker does, so that the memory is
// never unmapped under a copy.
func roundTrip(c *Copier, dev uintptr, blocks, size int, seed byte) (err error) {
	m, err := syscall.Mmap(-1, 0, 2*blocks*size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, syscall.Munmap(m)) }()
	addr := uintptr(unsafe.Pointer(&m[0]))
	if err := c.PinHost(addr, len(m)); err != nil {
		return err
	}
	for i := range blocks * size {
		m[i] = byte(i*131+i>>9) ^ seed
	}
	var in, out []connector.DeviceCopy
	for b := range blocks {
		at := dev + uintptr((blocks-1-b)*size)
		in = append(in, connector.DeviceCopy{Dst: at, Src: addr + uintptr(b*size), N: size})
		out = append(out, connector.DeviceCopy{Dst: addr + uintptr((blocks+b)*size), Src: at, N: size})
	}
	for _, step := range []struct {
		copy   func([]connector.DeviceCopy) (connector.CopyCompletion, error)
		copies []connector.DeviceCopy
	}{{c.CopyToDevice, in}, {c.CopyToHost, out}} {
		done, err := step.copy(step.copies)
		if err == nil {
			err = done.Wait(context.Background())
		}
		if err != nil {
			return errors.Join(err, c.UnpinHost(addr))
		}
	}
	if err := c.UnpinHost(addr); err != nil {
		return err
	}
	if !bytes.Equal(m[:blocks*size], m[blocks*size:]) {
		return errors.New("the bytes that came back differ")
	}
	return nil
}
