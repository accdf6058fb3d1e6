package memstore

import "math/bits"

// The arena allocator hands out extents of one mmap'd arena, in units of
// unitSize bytes. It is a two-level segregated-fit allocator: free extents
// sit in size buckets (eight per power of two), every extent (free or used)
// also sits in an address-ordered list so that a freed extent merges with
// free neighbours at once. Allocation takes the first extent that fits from
// the request's own bucket (an exact fit when all values have one size, the
// common case for KV blocks) or any extent from a larger non-empty bucket,
// found with a bitmap; the rest of the extent goes back as a free extent.
// Both operations run in constant time apart from a short bounded scan of
// the request's own bucket, and allocate no Go memory once the node table
// has grown to the peak number of extents.
//
// The allocator is not safe for concurrent use; the store guards it with
// a mutex.

const (
	unitShift = 6 // 64-byte units: cache-line aligned values
	unitSize  = 1 << unitShift

	nBuckets   = 512 // bucketOf(max int64) < nBuckets
	bucketScan = 8   // extents examined in the request's own bucket
	nilNode    = -1
)

// extent is a run of units, free or used, and a node of two lists: the
// address-ordered list of all extents and, when free, its bucket's list.
type extent struct {
	start, n     int64 // first unit, number of units
	prev, next   int32 // neighbours in address order
	fprev, fnext int32 // neighbours in the free bucket
	free         bool
}

type arena struct {
	units    int64 // total units
	used     int64 // units in used extents
	nodes    []extent
	spare    []int32 // indices of unused nodes
	heads    [nBuckets]int32
	nonEmpty [nBuckets / 64]uint64
}

// newArena returns an allocator of units units, all free in one extent.
func newArena(units int64) *arena {
	a := &arena{units: units}
	for i := range a.heads {
		a.heads[i] = nilNode
	}
	i := a.node()
	a.nodes[i] = extent{start: 0, n: units, prev: nilNode, next: nilNode, fprev: nilNode, fnext: nilNode}
	a.push(i)
	return a
}

// bucketOf returns the bucket of extents of n units: n itself below 8, then
// eight buckets per power of two.
func bucketOf(n int64) int {
	if n < 8 {
		return int(n)
	}
	fl := bits.Len64(uint64(n)) - 1 // >= 3
	sl := int(n>>(fl-3)) & 7
	return (fl-2)*8 + sl
}

// unitsFor returns the number of units that hold size bytes.
func unitsFor(size int64) int64 { return (size + unitSize - 1) >> unitShift }

// node returns the index of an unused node.
func (a *arena) node() int32 {
	if n := len(a.spare); n > 0 {
		i := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return i
	}
	a.nodes = append(a.nodes, extent{})
	return int32(len(a.nodes) - 1)
}

func (a *arena) release(i int32) {
	a.nodes[i] = extent{}
	a.spare = append(a.spare, i)
}

// push puts free extent i at the head of its bucket.
func (a *arena) push(i int32) {
	e := &a.nodes[i]
	b := bucketOf(e.n)
	e.free = true
	e.fprev = nilNode
	e.fnext = a.heads[b]
	if e.fnext != nilNode {
		a.nodes[e.fnext].fprev = i
	}
	a.heads[b] = i
	a.nonEmpty[b/64] |= 1 << (b % 64)
}

// unlink takes free extent i out of its bucket.
func (a *arena) unlink(i int32) {
	e := &a.nodes[i]
	b := bucketOf(e.n)
	if e.fprev != nilNode {
		a.nodes[e.fprev].fnext = e.fnext
	} else {
		a.heads[b] = e.fnext
		if e.fnext == nilNode {
			a.nonEmpty[b/64] &^= 1 << (b % 64)
		}
	}
	if e.fnext != nilNode {
		a.nodes[e.fnext].fprev = e.fprev
	}
	e.free = false
	e.fprev, e.fnext = nilNode, nilNode
}

// firstBucketAbove returns the first non-empty bucket after b, or -1.
func (a *arena) firstBucketAbove(b int) int {
	b++
	for w := b / 64; w < len(a.nonEmpty); w++ {
		m := a.nonEmpty[w]
		if w == b/64 {
			m &= ^uint64(0) << (b % 64)
		}
		if m != 0 {
			return w*64 + bits.TrailingZeros64(m)
		}
	}
	return -1
}

// alloc returns a used extent of n units (n > 0), or nilNode when no free
// extent is large enough.
func (a *arena) alloc(n int64) int32 {
	b := bucketOf(n)
	found := int32(nilNode)
	i := a.heads[b]
	for k := 0; i != nilNode && k < bucketScan; k++ {
		if a.nodes[i].n >= n {
			found = i
			break
		}
		i = a.nodes[i].fnext
	}
	if found == nilNode {
		if bb := a.firstBucketAbove(b); bb >= 0 {
			found = a.heads[bb]
		}
	}
	for ; found == nilNode && i != nilNode; i = a.nodes[i].fnext {
		if a.nodes[i].n >= n { // the rest of the own bucket, as a last resort
			found = i
		}
	}
	if found == nilNode {
		return nilNode
	}
	a.unlink(found)
	if rest := a.nodes[found].n - n; rest > 0 {
		r := a.node() // may move a.nodes: index again below
		e := &a.nodes[found]
		a.nodes[r] = extent{start: e.start + n, n: rest, prev: found, next: e.next, fprev: nilNode, fnext: nilNode}
		if e.next != nilNode {
			a.nodes[e.next].prev = r
		}
		e.next = r
		e.n = n
		a.push(r)
	}
	a.used += n
	return found
}

// offset returns the byte offset of extent i in the arena.
func (a *arena) offset(i int32) int64 { return a.nodes[i].start << unitShift }

// free returns used extent i, merging it with free neighbours.
func (a *arena) free(i int32) {
	e := &a.nodes[i]
	if e.free || e.n == 0 {
		panic("memstore: arena: free of an extent that is not in use")
	}
	a.used -= e.n
	if p := e.prev; p != nilNode && a.nodes[p].free {
		a.unlink(p)
		a.nodes[p].n += e.n
		a.nodes[p].next = e.next
		if e.next != nilNode {
			a.nodes[e.next].prev = p
		}
		a.release(i)
		i = p
		e = &a.nodes[i]
	}
	if nx := e.next; nx != nilNode && a.nodes[nx].free {
		a.unlink(nx)
		e.n += a.nodes[nx].n
		e.next = a.nodes[nx].next
		if e.next != nilNode {
			a.nodes[e.next].prev = i
		}
		a.release(nx)
	}
	a.push(i)
}

// freeStats returns the number of free extents and the size in units of
// the largest, for error messages and tests.
func (a *arena) freeStats() (count int, largest int64) {
	for b := range a.heads {
		for i := a.heads[b]; i != nilNode; i = a.nodes[i].fnext {
			count++
			largest = max(largest, a.nodes[i].n)
		}
	}
	return count, largest
}
