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

// repeatTable is an open-addressing hash table of the keys of one batch,
// in the call's arena, to find keys named more than once: each slot is 0
// (empty), or a key's hash in the high 32 bits and an index of that key
// in the batch plus one in the low 32.
type repeatTable []uint64

// table returns the cleared repeat table of the layout.
func (a *arena) table(l layout) repeatTable {
	t := repeatTable(unsafe.Slice((*uint64)(unsafe.Pointer(&a.mem[l.tbl])), l.slots))
	clear(t)
	return t
}

// add finds keys[i] in t, hashed to h, or adds it. It returns its slot and
// the index the slot held before, or -1 when the key is new.
func (t repeatTable) add(h uint64, keys []string, i int) (slot, prev int) {
	mask := uint64(len(t) - 1)
	tag := h >> 32
	for p := h & mask; ; p = (p + 1) & mask {
		e := t[p]
		if e == 0 {
			t[p] = tag<<32 | uint64(i+1)
			return int(p), -1
		}
		if e>>32 == tag {
			if j := int(uint32(e)) - 1; keys[j] == keys[i] {
				return int(p), j
			}
		}
	}
}

// keyHash is the hash of a key for a repeatTable: three words of it (the
// first, middle and last eight bytes, which cover the tenant, the shard
// and the block hash of the keys connectors build) and its length, mixed.
// Keys that agree on those bytes collide and are told apart by comparing
// them whole, so a poor spread costs time, never correctness.
func keyHash(k string) uint64 {
	n := len(k)
	var a, b, c uint64
	if n >= 8 {
		a, b, c = load64(k, 0), load64(k, n/2-4), load64(k, n-8)
	} else {
		for i := 0; i < n; i++ {
			c = c<<8 | uint64(k[i])
		}
	}
	h := (c ^ uint64(n)) * 0x9e3779b97f4a7c15
	h = (h ^ b ^ h>>31) * 0xbf58476d1ce4e5b9
	h = (h ^ a ^ h>>29) * 0x94d049bb133111eb
	return h ^ h>>32
}

// load64 reads eight bytes of s at i, little-endian.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// at returns the index slot holds; set makes it hold i.
func (t repeatTable) at(slot int) int { return int(uint32(t[slot])) - 1 }
func (t repeatTable) set(slot, i int) { t[slot] = t[slot]&^0xffffffff | uint64(i+1) }
