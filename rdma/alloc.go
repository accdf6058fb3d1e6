package rdma

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// ErrUnsupported is returned by operations this platform or this kind of
// memory does not support, such as [AllocHost] without mmap or [Copy] of
// device memory. It wraps errors.ErrUnsupported.
var ErrUnsupported = fmt.Errorf("rdma: %w", errors.ErrUnsupported)

// ErrInvalidRegion is returned for a region that cannot describe memory: a
// negative length, or a non-empty region at address zero.
var ErrInvalidRegion = errors.New("rdma: invalid region")

// HostMemory is a span of host memory mapped outside the Go heap: page
// aligned, zero filled when allocated, never moved, and never freed by the
// garbage collector. It is the memory that stores, transfer engines and
// device runtimes register and copy from or into.
//
// A HostMemory must be released with [HostMemory.Free]. Nothing frees it
// implicitly, because [Region] values taken from it are plain addresses that
// do not keep it alive.
type HostMemory struct {
	mu struct {
		sync.Mutex
		mem []byte // the whole mapping (page rounded); nil once freed
	}
	n    int     // bytes asked for
	addr uintptr // first byte
}

// AllocHost maps n bytes of zeroed host memory outside the Go heap. The
// mapping is rounded up to whole pages; [HostMemory.Len] and the region
// report n. It returns an error naming n when n is not positive or the
// system refuses the mapping, and an error wrapping [ErrUnsupported] on
// platforms without mmap.
func AllocHost(n int) (*HostMemory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rdma: AllocHost: size %d: must be positive", n)
	}
	page := os.Getpagesize()
	size := n
	if rem := n % page; rem != 0 {
		if n > int(^uint(0)>>1)-page {
			return nil, fmt.Errorf("rdma: AllocHost: size %d: too large", n)
		}
		size = n + page - rem
	}
	mem, err := mapAnon(size)
	if err != nil {
		return nil, fmt.Errorf("rdma: AllocHost: map %d bytes: %w", size, err)
	}
	m := &HostMemory{n: n, addr: sliceAddr(mem)}
	m.mu.mem = mem
	return m, nil
}

// Len returns the size in bytes that was asked for, also after Free.
func (m *HostMemory) Len() int { return m.n }

// Region returns the region of the whole allocation, in host memory, or the
// zero Region once the memory is freed.
func (m *HostMemory) Region() Region {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return Region{}
	}
	return Region{Addr: m.addr, Len: m.n, Loc: Host}
}

// Bytes returns a slice of length and capacity [HostMemory.Len] that
// aliases the memory, or nil once it is freed. The slice must not be used
// after Free.
func (m *HostMemory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return nil
	}
	return m.mu.mem[:m.n:m.n]
}

// Free unmaps the memory. It is idempotent and safe to call concurrently:
// the first call unmaps and returns its error, later calls return nil. Every
// slice and region taken from m becomes invalid; using one afterwards faults.
func (m *HostMemory) Free() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return nil
	}
	mem := m.mu.mem
	m.mu.mem = nil
	if err := unmap(mem); err != nil {
		return fmt.Errorf("rdma: free %d bytes at %#x: %w", len(mem), m.addr, err)
	}
	return nil
}

// String describes the allocation for logs: its size and address.
func (m *HostMemory) String() string {
	return fmt.Sprintf("host memory: %d bytes at %#x", m.n, m.addr)
}
