package memstore

import (
	"unsafe"

	"github.com/kvconnect/kvconnect/store"
)

// The index of a shard holds no Go pointers, so that millions of keys cost
// the garbage collector nothing to scan and the index little memory: a
// key takes one 48-byte entry, one 8-byte slot of an open-addressing table
// kept at most 3/4 full, and its bytes in the shard's key heap, a byte
// slice that holds every key of the shard back to back (with the holes of
// removed keys until it is compacted). Entries are addressed by index;
// entry 0 is the sentinel of the shard's LRU list.

// entry is one stored value. All fields are guarded by the shard's mu;
// off and size do not change while the entry is pinned.
type entry struct {
	off        int64  // byte offset in the arena
	size       int    // value bytes
	stamp      uint64 // LRU clock at the last put or get
	node       int32  // arena extent
	pins       int32  // gets copying out of it now
	prev, next int32  // LRU list; next also links the free entries
	kref       uint32 // the key's offset in the shard's key heap
	klen       uint16 // the key's length; 0: the entry is not in the index
	dead       bool   // removed from the index while pinned: freed by the last unpin
}

// A key's length fits an entry's klen: store.ValidateKey refuses longer
// keys (this constant does not compile if store.MaxKeyLen grows past it).
const _ = uint16(store.MaxKeyLen)

// maxHeap bounds a shard's key heap, whose offsets are 32-bit.
const maxHeap = 1<<32 - 1

// index is a shard's key index.
type index struct {
	slots []uint64 // per slot: tag<<32 | entry index; 0 empty
	count int      // slots in use
	ents  []entry  // ents[0] is the LRU sentinel
	free  int32    // first free entry, linked by next; 0 none
	heap  []byte   // key bytes
	hole  int      // bytes of heap no entry uses
}

func (x *index) init() {
	x.slots = make([]uint64, 16)
	x.ents = make([]entry, 1, 16)
}

// A slot holds the low 32 bits of its key's hash (which bits the table's
// position comes from, so a slot says where its entry's run starts without
// hashing the key again) and the entry's index (never 0, so a slot in use
// is never 0). The shard comes from the hash's high 32 bits.
func tagOf(h uint64) uint64 { return h & 0xffffffff }

func (x *index) key(e *entry) string {
	return unsafe.String(&x.heap[e.kref], int(e.klen))
}

// find returns the entry of key, whose hash is h, or 0.
func (x *index) find(key string, h uint64) int32 {
	mask := uint64(len(x.slots) - 1)
	tag := tagOf(h)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0
		}
		if s>>32 == tag {
			id := int32(uint32(s))
			e := &x.ents[id]
			if int(e.klen) == len(key) && string(x.heap[e.kref:int(e.kref)+len(key)]) == key {
				return id
			}
		}
	}
}

// insert adds key, absent, with hash h, and returns its new entry, whose
// fields but the key's the caller sets; the key's bytes are copied. It
// returns 0 when the shard's key heap would pass 4 GiB.
func (x *index) insert(key string, h uint64) int32 {
	if (x.count+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	if x.hole > len(x.heap)/2 && x.hole > 1<<16 || len(x.heap)+len(key) > maxHeap {
		x.compact()
		if len(x.heap)+len(key) > maxHeap {
			return 0
		}
	}
	id := x.free
	if id != 0 {
		x.free = x.ents[id].next
	} else {
		x.ents = append(x.ents, entry{})
		id = int32(len(x.ents) - 1)
	}
	e := &x.ents[id]
	*e = entry{kref: uint32(len(x.heap)), klen: uint16(len(key))}
	x.heap = append(x.heap, key...)
	x.place(h, id)
	return id
}

// place puts entry id, of hash h, into the first empty slot of its run.
func (x *index) place(h uint64, id int32) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i] != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = tagOf(h)<<32 | uint64(uint32(id))
	x.count++
}

// grow doubles the table and places every entry again.
func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, 2*len(old))
	x.count = 0
	for _, s := range old {
		if s != 0 {
			x.place(s>>32, int32(uint32(s)))
		}
	}
}

// remove takes entry id, whose key has hash h, out of the table and frees
// its key's bytes; the entry itself stays for the caller to free (release)
// once nothing reads from it.
func (x *index) remove(id int32, h uint64) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for uint32(x.slots[i]) != uint32(id) {
		i = (i + 1) & mask
	}
	// Backward-shift deletion: move later slots of the run into the hole
	// when their home is not between the hole and them.
	for j := (i + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		home := x.homeOf(x.slots[j], mask)
		if (j-home)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = 0
	x.count--
	e := &x.ents[id]
	x.hole += int(e.klen)
	e.klen = 0
}

// homeOf returns the slot where the entry of slot value s would go first.
func (x *index) homeOf(s uint64, mask uint64) uint64 {
	return s >> 32 & mask
}

// release puts entry id, out of the table and unpinned, on the free list.
func (x *index) release(id int32) {
	x.ents[id] = entry{next: x.free}
	x.free = id
}

// compact rewrites the key heap with the keys of the entries in the
// index only.
func (x *index) compact() {
	heap := make([]byte, 0, len(x.heap)-x.hole+len(x.heap)/8)
	for id := 1; id < len(x.ents); id++ {
		e := &x.ents[id]
		if e.klen == 0 {
			continue
		}
		k := x.heap[e.kref : int(e.kref)+int(e.klen)]
		e.kref = uint32(len(heap))
		heap = append(heap, k...)
	}
	x.heap, x.hole = heap, 0
}

// reset empties the index, keeping nothing.
func (x *index) reset() {
	*x = index{}
	x.init()
}
