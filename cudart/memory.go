package cudart

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// HostAllocFlags are the flags of cudaHostAlloc.
type HostAllocFlags uint32

// Flags for [Device.HostAlloc].
const (
	HostAllocDefault       HostAllocFlags = 0 // pinned, usable from the allocating device's context
	HostAllocPortable      HostAllocFlags = 1 // pinned for every device's context
	HostAllocMapped        HostAllocFlags = 2 // mapped into the device address space
	HostAllocWriteCombined HostAllocFlags = 4 // write-combined: fast to write and copy to the device, slow for the CPU to read
)

// HostRegisterFlags are the flags of cudaHostRegister.
type HostRegisterFlags uint32

// Flags for [Device.HostRegister].
const (
	HostRegisterDefault  HostRegisterFlags = 0 // pinned for the registering device's context
	HostRegisterPortable HostRegisterFlags = 1 // pinned for every device's context
	HostRegisterMapped   HostRegisterFlags = 2 // mapped into the device address space
	HostRegisterIoMemory HostRegisterFlags = 4 // the range is I/O memory (a device's BAR)
	HostRegisterReadOnly HostRegisterFlags = 8 // the device only reads the range
)

func checkSize(field string, n int) error {
	if n <= 0 {
		return fmt.Errorf("cudart: %s %d: must be positive", field, n)
	}
	return nil
}

// DeviceBuffer is device memory from cudaMalloc. It is safe for concurrent
// use; Free must come after every copy that uses it has completed.
type DeviceBuffer struct {
	d     *Device
	addr  uintptr
	n     int
	freed atomic.Bool
}

// Malloc allocates n bytes of device memory (cudaMalloc). The memory is
// not initialized.
func (d *Device) Malloc(n int) (*DeviceBuffer, error) {
	if err := checkSize("device allocation size", n); err != nil {
		return nil, err
	}
	var p uintptr
	if err := d.onDevice("cudaMalloc", func(t *table) int32 { return t.malloc(&p, uintptr(n)) }); err != nil {
		return nil, fmt.Errorf("allocate %d bytes on device %d: %w", n, d.ordinal, err)
	}
	return &DeviceBuffer{d: d, addr: p, n: n}, nil
}

// Addr returns the device address of the first byte.
func (b *DeviceBuffer) Addr() uintptr { return b.addr }

// Len returns the size in bytes.
func (b *DeviceBuffer) Len() int { return b.n }

// Device returns the device the memory belongs to.
func (b *DeviceBuffer) Device() *Device { return b.d }

// Free releases the memory (cudaFree). Calls after the first return nil.
func (b *DeviceBuffer) Free() error {
	if !b.freed.CompareAndSwap(false, true) {
		return nil
	}
	return b.d.onDevice("cudaFree", func(t *table) int32 { return t.free(b.addr) })
}

// HostBuffer is pinned (page-locked) host memory from cudaHostAlloc:
// outside the Go heap, so native code and the device may use it at any
// time. It is safe for concurrent use; Free must come after every copy that
// uses it has completed.
type HostBuffer struct {
	d     *Device
	addr  uintptr
	n     int
	freed atomic.Bool
}

// HostAlloc allocates n bytes of pinned host memory (cudaHostAlloc) with d
// current. With [HostAllocPortable] every device's context sees it as
// pinned.
func (d *Device) HostAlloc(n int, flags HostAllocFlags) (*HostBuffer, error) {
	if err := checkSize("host allocation size", n); err != nil {
		return nil, err
	}
	if flags&^(HostAllocPortable|HostAllocMapped|HostAllocWriteCombined) != 0 {
		return nil, fmt.Errorf("cudart: host allocation flags %#x: unknown bits", uint32(flags))
	}
	var p uintptr
	if err := d.onDevice("cudaHostAlloc", func(t *table) int32 { return t.hostAlloc(&p, uintptr(n), uint32(flags)) }); err != nil {
		return nil, fmt.Errorf("allocate %d pinned bytes: %w", n, err)
	}
	return &HostBuffer{d: d, addr: p, n: n}, nil
}

// Addr returns the host address of the first byte.
func (b *HostBuffer) Addr() uintptr { return b.addr }

// Len returns the size in bytes.
func (b *HostBuffer) Len() int { return b.n }

// Bytes returns a slice over the memory. It is valid until Free; it must
// not be used while an asynchronous copy writes the bytes.
func (b *HostBuffer) Bytes() []byte {
	return unsafe.Slice((*byte)(addrPointer(b.addr)), b.n)
}

// Free releases the memory (cudaFreeHost). Calls after the first return
// nil.
func (b *HostBuffer) Free() error {
	if !b.freed.CompareAndSwap(false, true) {
		return nil
	}
	return b.d.onDevice("cudaFreeHost", func(t *table) int32 { return t.freeHost(b.addr) })
}

// HostRegistration is a host range pinned by cudaHostRegister. It is safe
// for concurrent use.
type HostRegistration struct {
	d     *Device
	addr  uintptr
	n     int
	freed atomic.Bool
}

// HostRegister pins n bytes of host memory at addr (cudaHostRegister), so
// that copies to and from it run at full speed and asynchronously. The
// memory must lie outside the Go heap (for example from mmap) and stay
// mapped until Unregister: the Go garbage collector neither sees nor keeps
// it.
func (d *Device) HostRegister(addr uintptr, n int, flags HostRegisterFlags) (*HostRegistration, error) {
	if addr == 0 {
		return nil, fmt.Errorf("cudart: host register address 0: must not be null")
	}
	if err := checkSize("host register size", n); err != nil {
		return nil, err
	}
	if flags&^(HostRegisterPortable|HostRegisterMapped|HostRegisterIoMemory|HostRegisterReadOnly) != 0 {
		return nil, fmt.Errorf("cudart: host register flags %#x: unknown bits", uint32(flags))
	}
	if err := d.onDevice("cudaHostRegister", func(t *table) int32 { return t.hostRegister(addr, uintptr(n), uint32(flags)) }); err != nil {
		return nil, fmt.Errorf("register %d bytes at %#x: %w", n, addr, err)
	}
	return &HostRegistration{d: d, addr: addr, n: n}, nil
}

// Addr returns the first byte of the registered range.
func (h *HostRegistration) Addr() uintptr { return h.addr }

// Len returns the length of the registered range.
func (h *HostRegistration) Len() int { return h.n }

// Unregister unpins the range (cudaHostUnregister). Calls after the first
// return nil.
func (h *HostRegistration) Unregister() error {
	if !h.freed.CompareAndSwap(false, true) {
		return nil
	}
	return h.d.onDevice("cudaHostUnregister", func(t *table) int32 { return t.hostUnregister(h.addr) })
}

// addrPointer turns an address of memory outside the Go heap into a
// pointer without tripping vet's unsafeptr check, which is about Go-heap
// memory.
func addrPointer(a uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}
