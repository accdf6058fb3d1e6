package mooncake

import (
	"sync"
	"unsafe"
)

// arena is a block of memory outside the Go heap (mmap) in which a call
// lays out what it hands to native code: NUL-terminated copies of keys,
// the arrays of pointers and sizes, the results.
type arena struct {
	mem []byte
}

// addr returns the address of byte off of a.
func (a *arena) addr(off int) uintptr { return uintptr(unsafe.Pointer(&a.mem[off])) }

// words returns n uintptr-sized slots of a starting at off (8-aligned).
func (a *arena) words(off, n int) []uintptr {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uintptr)(unsafe.Pointer(&a.mem[off])), n)
}

// int32s returns n int32 slots of a starting at off (4-aligned).
func (a *arena) int32s(off, n int) []int32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&a.mem[off])), n)
}

// int64s returns n int64 slots of a starting at off (8-aligned).
func (a *arena) int64s(off, n int) []int64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&a.mem[off])), n)
}

// cstring writes s and a NUL at off and returns the offset past the NUL.
func (a *arena) cstring(off int, s string) int {
	copy(a.mem[off:], s)
	a.mem[off+len(s)] = 0
	return off + len(s) + 1
}

// arenaPool keeps arenas for reuse, so that a call maps memory only when
// no idle arena is large enough.
type arenaPool struct {
	mu     sync.Mutex
	free   []*arena
	closed bool
}

const (
	arenaMin     = 64 << 10 // smallest arena mapped
	arenaMaxIdle = 16       // idle arenas kept
)

// get returns an arena of at least n bytes.
func (p *arenaPool) get(n int) (*arena, error) {
	p.mu.Lock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if a := p.free[i]; len(a.mem) >= n {
			p.free = append(p.free[:i], p.free[i+1:]...)
			p.mu.Unlock()
			return a, nil
		}
	}
	p.mu.Unlock()
	size := arenaMin
	for size < n {
		size *= 2
	}
	mem, err := mapMem(size)
	if err != nil {
		return nil, err
	}
	return &arena{mem: mem}, nil
}

// put returns a to the pool, or unmaps it when the pool is full or closed
// (then the smallest arena goes).
func (p *arenaPool) put(a *arena) {
	p.mu.Lock()
	if !p.closed && len(p.free) < arenaMaxIdle {
		p.free = append(p.free, a)
		p.mu.Unlock()
		return
	}
	if !p.closed {
		small := 0
		for i, f := range p.free {
			if len(f.mem) < len(p.free[small].mem) {
				small = i
			}
		}
		if len(p.free[small].mem) < len(a.mem) {
			a, p.free[small] = p.free[small], a
		}
	}
	p.mu.Unlock()
	unmapMem(a.mem)
}

// close unmaps every idle arena; later puts unmap theirs.
func (p *arenaPool) close() {
	p.mu.Lock()
	free := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	for _, a := range free {
		unmapMem(a.mem)
	}
}
