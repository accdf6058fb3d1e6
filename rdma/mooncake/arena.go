package mooncake

import (
	"sync"
	"unsafe"

	"github.com/kvconnect/kvconnect/rdma"
)

// arena is host memory outside the Go heap (rdma.AllocHost) in which the
// binding lays out what it hands to native code: C strings, request
// arrays, status slots.
type arena struct {
	mem  *rdma.HostMemory
	buf  []byte
	base uintptr // address of buf[0]
}

// addr returns the address of byte off.
func (a *arena) addr(off int) uintptr { return a.base + uintptr(off) }

// cstring writes s and a NUL at off and returns the offset past the NUL.
func (a *arena) cstring(off int, s string) int {
	copy(a.buf[off:], s)
	a.buf[off+len(s)] = 0
	return off + len(s) + 1
}

// words returns n pointer-sized slots starting at off (8-aligned).
func (a *arena) words(off, n int) []uintptr {
	return unsafe.Slice((*uintptr)(unsafe.Pointer(&a.buf[off])), n)
}

// requests returns n request slots starting at off (8-aligned).
func (a *arena) requests(off, n int) []request {
	return unsafe.Slice((*request)(unsafe.Pointer(&a.buf[off])), n)
}

// status returns the status slot at off (8-aligned).
func (a *arena) status(off int) *status {
	return (*status)(unsafe.Pointer(&a.buf[off]))
}

// arenaPool keeps arenas for reuse, one free list per power-of-two size,
// so that a batch maps memory only when no idle arena fits.
type arenaPool struct {
	mu     sync.Mutex
	free   map[int][]*arena // by size
	idle   int
	closed bool
}

const (
	arenaMin     = 4 << 10 // smallest arena mapped
	arenaMaxIdle = 64      // idle arenas kept
)

// get returns an arena of at least n bytes.
func (p *arenaPool) get(n int) (*arena, error) {
	size := arenaMin
	for size < n {
		size *= 2
	}
	p.mu.Lock()
	if l := p.free[size]; len(l) > 0 {
		a := l[len(l)-1]
		p.free[size] = l[:len(l)-1]
		p.idle--
		p.mu.Unlock()
		return a, nil
	}
	p.mu.Unlock()
	mem, err := rdma.AllocHost(size)
	if err != nil {
		return nil, err
	}
	return &arena{mem: mem, buf: mem.Bytes(), base: mem.Region().Addr}, nil
}

// put returns a to the pool, or unmaps it when the pool is full or closed.
func (p *arenaPool) put(a *arena) {
	p.mu.Lock()
	if !p.closed && p.idle < arenaMaxIdle {
		if p.free == nil {
			p.free = make(map[int][]*arena)
		}
		p.free[len(a.buf)] = append(p.free[len(a.buf)], a)
		p.idle++
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	a.release()
}

// close unmaps every idle arena; later puts unmap theirs.
func (p *arenaPool) close() {
	p.mu.Lock()
	free := p.free
	p.free, p.idle, p.closed = nil, 0, true
	p.mu.Unlock()
	for _, l := range free {
		for _, a := range l {
			a.release()
		}
	}
}

// release unmaps a. Unmapping memory AllocHost mapped fails only on a
// programmer error.
func (a *arena) release() {
	if err := a.mem.Free(); err != nil {
		panic(err)
	}
}
