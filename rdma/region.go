package rdma

import (
	"errors"
	"fmt"
	"unsafe"
)

// Location says where the bytes of a [Region] live: host memory, or the
// memory of one accelerator device, named by its ordinal.
type Location int32

// Host is the Location of host (CPU) memory.
const Host Location = -1

// Device returns the Location of device memory on the accelerator with the
// given ordinal (0, 1, ...).
func Device(ordinal int) Location { return Location(ordinal) }

// IsHost reports whether l is host memory.
func (l Location) IsHost() bool { return l == Host }

// Ordinal returns the device ordinal of l, or -1 for host memory.
func (l Location) Ordinal() int { return int(l) }

// String returns "cpu" for host memory and "cuda:N" for device N, the
// spelling transfer engines use for memory locations.
func (l Location) String() string {
	if l == Host {
		return "cpu"
	}
	return fmt.Sprintf("cuda:%d", int(l))
}

// ErrOutOfRange is returned when a sub-range does not lie inside its region.
var ErrOutOfRange = errors.New("rdma: range outside region")

// Region is a span of memory outside the Go heap that native code (a store
// client, a transfer engine, a CUDA runtime) may read or write: host memory
// from [AllocHost] or a device allocation. A Region is a plain value: it
// does not own the memory it names, and copying it copies the description,
// not the bytes. The zero Region is empty.
//
// Addr is an address, not a Go pointer: the garbage collector does not trace
// it, and nothing keeps the memory alive but its owner.
type Region struct {
	Addr uintptr  // first byte
	Len  int      // length in bytes
	Loc  Location // where the bytes live
}

// End returns the address one past the last byte of r.
func (r Region) End() uintptr { return r.Addr + uintptr(r.Len) }

// Sub returns the part of r that starts off bytes in and is n bytes long.
// It returns an error wrapping [ErrOutOfRange] if that part does not lie
// inside r.
func (r Region) Sub(off, n int) (Region, error) {
	if off < 0 || n < 0 || off > r.Len || n > r.Len-off {
		return Region{}, fmt.Errorf("%w: [%d, %d+%d) of a %d-byte region", ErrOutOfRange, off, off, n, r.Len)
	}
	return Region{Addr: r.Addr + uintptr(off), Len: n, Loc: r.Loc}, nil
}

// Contains reports whether s lies entirely inside r, in the same location.
func (r Region) Contains(s Region) bool {
	return s.Loc == r.Loc && s.Addr >= r.Addr && s.Len >= 0 && s.End() <= r.End() && s.End() >= s.Addr
}

// Bytes returns a slice that aliases the bytes of a host region, or nil for
// a device region or an empty one. The slice is valid only while the owner
// keeps the memory mapped; it must not be kept past the region's free.
func (r Region) Bytes() []byte {
	if r.Loc != Host || r.Len == 0 || r.Addr == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(addrPointer(r.Addr)), r.Len)
}

// addrPointer turns an address of memory outside the Go heap into a pointer
// without tripping vet's unsafeptr check, which is about Go-heap memory.
func addrPointer(a uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}
