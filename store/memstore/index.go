package memstore

import (
	"encoding/binary"
	"unsafe"

	"github.com/kvconnect/kvconnect/store"
)

// The index of a shard holds one Go pointer per 64 KiB of keys, so that
// millions of keys cost the garbage collector almost nothing to scan and
// the index little memory: a key takes one 40-byte entry, one 8-byte slot
// of an open-addressing table kept at most 3/4 full, and a record in the
// shard's key heap, chunks of 64 KiB that hold the records back to back
// (with the holes of removed keys until it is compacted). The heap grows
// a chunk at a time, without copying what it holds (but for the first
// chunk, which doubles up to 64 KiB), and wastes at most a record's bytes
// at the end of a chunk. Entries are addressed by index;
// entry 0 is the sentinel of the shard's LRU list.
//
// A slot points at its key's record, which holds what a lookup needs
// next to the key's bytes: the entry's index and the value's size. A
// lookup so reads a slot and then a record, two reads in a row; with
// millions of keys each is a cache miss, and an entry between them would
// be a third.

// entry is one stored value. All fields are guarded by the shard's mu;
// off and the size in the key's record do not change while the entry is
// pinned.
type entry struct {
	off        int64  // byte offset in the arena
	stamp      uint64 // LRU clock at the last put or get
	node       int32  // arena extent
	pins       int32  // gets copying out of it now
	prev, next int32  // LRU list; next also links the free entries
	kref       uint32 // the place of the key's record in the shard's key heap
	klen       uint16 // the key's length; 0: the entry is not in the index
	dead       bool   // removed from the index while pinned: freed by the last unpin
}

// A key's record in the heap:
//
//	offset  size  field
//	0       4     the entry's index
//	4       6     the value's size in bytes
//	10      2     the key's length
//	12      klen  the key
//
// All integers are little endian.
const (
	recHdr  = 12
	maxSize = 1<<48 - 1 // the largest value size a record holds
)

// A key's length fits an entry's klen: store.ValidateKey refuses longer
// keys (this constant does not compile if store.MaxKeyLen grows past it).
const _ = uint16(store.MaxKeyLen)

// A record's place in the heap, kref, is its chunk's index times 2^16
// plus its offset in the chunk: 32 bits bound a shard's heap to 65,536
// chunks of 64 KiB, 4 GiB.
const (
	chunkBits  = 16
	chunkSize  = 1 << chunkBits
	chunkMask  = chunkSize - 1
	maxChunks  = 1 << (32 - chunkBits)
	firstChunk = 64 // the first chunk's first capacity: a shard of few keys takes little
)

// index is a shard's key index.
type index struct {
	slots []uint64 // per slot: tag<<32 | the place of the key's record; 0 empty
	count int      // slots in use
	ents  []entry  // ents[0] is the LRU sentinel
	free  int32    // first free entry, linked by next; 0 none
	heap  chunks   // key records; heap[0][0] is padding, so that no record is at 0
	used  int      // bytes of the chunks' records and padding
	hole  int      // bytes of removed records, still in the chunks
	limit int      // chunks the heap may hold: maxChunks (tests lower it)
}

func (x *index) init() {
	x.slots = make([]uint64, 16)
	x.ents = make([]entry, 1, 16)
	x.heap = chunks{make([]byte, 1, firstChunk)}
	x.used = 1
	x.limit = maxChunks
}

// A slot holds the low 32 bits of its key's hash (which bits the table's
// position comes from, so a slot says where its run starts without
// hashing the key again) and the place of the key's record (never 0, so
// a slot in use is never 0). The shard comes from the hash's high 32 bits.
func tagOf(h uint64) uint64 { return h & 0xffffffff }

// rec returns the heap from the record at kref to its chunk's end.
func (x *index) rec(kref uint32) []byte {
	return x.heap[kref>>chunkBits][kref&chunkMask:]
}

func (x *index) key(e *entry) string {
	return unsafe.String(&x.rec(e.kref)[recHdr], int(e.klen))
}

// A record's fields, read from the record at the start of b.
func recID(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }
func recLen(b []byte) int  { return int(binary.LittleEndian.Uint16(b[10:])) }
func recSize(b []byte) int {
	return int(uint64(binary.LittleEndian.Uint32(b[4:])) | uint64(binary.LittleEndian.Uint16(b[8:]))<<32)
}

// size returns the value size of entry id, which is in the index.
func (x *index) size(id int32) int {
	return recSize(x.rec(x.ents[id].kref))
}

// find returns the entry of key, whose hash is h, and its value's size,
// or 0.
func (x *index) find(key string, h uint64) (int32, int) {
	mask := uint64(len(x.slots) - 1)
	tag := tagOf(h)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0, 0
		}
		if s>>32 == tag {
			rec := x.rec(uint32(s))
			if recLen(rec) == len(key) && string(rec[recHdr:recHdr+len(key)]) == key {
				return recID(rec), recSize(rec)
			}
		}
	}
}

// insert adds key, absent, with hash h and a value of size bytes, and
// returns its new entry, whose fields but the key's the caller sets; the
// key's bytes are copied. It returns 0 when the shard's key heap is full
// (x.limit chunks: 65,536, 4 GiB less what records left unused at the
// chunks' ends) and its removed records take less than a chunk: a full
// heap is compacted once a chunk's worth of its keys are gone, not at
// every put.
func (x *index) insert(key string, h uint64, size int) int32 {
	if (x.count+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	n := recHdr + len(key)
	if x.hole > x.used/2 && x.hole > chunkSize || !x.fits(n) && x.hole >= chunkSize {
		x.compact()
	}
	if !x.fits(n) {
		return 0
	}
	id := x.free
	if id != 0 {
		x.free = x.ents[id].next
	} else {
		x.ents = append(x.ents, entry{})
		id = int32(len(x.ents) - 1)
	}
	e := &x.ents[id]
	kref, c := x.heap.add(n)
	binary.LittleEndian.PutUint32(c, uint32(id))
	binary.LittleEndian.PutUint32(c[4:], uint32(size))
	binary.LittleEndian.PutUint16(c[8:], uint16(size>>32))
	binary.LittleEndian.PutUint16(c[10:], uint16(len(key)))
	copy(c[recHdr:], key)
	x.used += n
	*e = entry{kref: kref, klen: uint16(len(key))}
	x.place(h, kref)
	return id
}

// chunks is a shard's key heap: chunks of records.
type chunks [][]byte

// fits reports whether a record of n bytes fits in the heap.
func (x *index) fits(n int) bool {
	last := x.heap[len(x.heap)-1]
	return len(last)+n <= chunkSize || len(x.heap) < x.limit
}

// add appends n bytes to the last chunk of h, or to a new one where they
// do not fit (the caller checked that they fit in the heap), and returns
// their place and the bytes, to fill.
func (h *chunks) add(n int) (uint32, []byte) {
	c := &(*h)[len(*h)-1]
	if len(*c)+n > chunkSize {
		*h = append(*h, make([]byte, 0, chunkSize))
		c = &(*h)[len(*h)-1]
	} else if cap(*c)-len(*c) < n {
		// The first chunk starts small and doubles up to a whole chunk.
		grown := make([]byte, len(*c), min(chunkSize, max(2*cap(*c), len(*c)+n)))
		copy(grown, *c)
		*c = grown
	}
	at := len(*c)
	*c = (*c)[:at+n]
	return uint32(len(*h)-1)<<chunkBits | uint32(at), (*c)[at : at+n]
}

// place puts the record at kref, of a key of hash h, into the first empty
// slot of its run.
func (x *index) place(h uint64, kref uint32) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i] != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = tagOf(h)<<32 | uint64(kref)
	x.count++
}

// grow doubles the table and places every record again.
func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, 2*len(old))
	x.count = 0
	for _, s := range old {
		if s != 0 {
			x.place(s>>32, uint32(s))
		}
	}
}

// remove takes entry id, whose key has hash h, out of the table and frees
// its record; the entry itself stays for the caller to free (release)
// once nothing reads from it.
func (x *index) remove(id int32, h uint64) {
	mask := uint64(len(x.slots) - 1)
	e := &x.ents[id]
	i := h & mask
	for uint32(x.slots[i]) != e.kref {
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
	x.hole += recHdr + int(e.klen)
	e.klen = 0
}

// homeOf returns the slot where the record of slot value s would go
// first.
func (x *index) homeOf(s uint64, mask uint64) uint64 {
	return s >> 32 & mask
}

// release puts entry id, out of the table and unpinned, on the free list.
func (x *index) release(id int32) {
	x.ents[id] = entry{next: x.free}
	x.free = id
}

// compact rewrites the key heap with the records of the entries in the
// index only, in the order the heap holds them, and points the slots at
// their new places. A record's new place is never after its old one (in
// chunk, then offset order): a record that does not fit where the new
// heap's last chunk ends starts the next chunk, at offset 0, which is not
// past where it was. So the new heap has at most the old one's chunks.
func (x *index) compact() {
	old := x.heap
	heap := chunks{make([]byte, 1, min(chunkSize, max(firstChunk, x.used-x.hole)))}
	used := 1
	for ci, c := range old {
		o := 0
		if ci == 0 {
			o = 1 // the padding byte
		}
		for o < len(c) {
			rec := c[o:]
			id, n := recID(rec), recHdr+recLen(rec)
			ref := uint32(ci)<<chunkBits | uint32(o)
			o += n
			// A removed record's bytes stay, and its entry may have been
			// given to another key since: only the entry's own record is
			// live. An entry already moved points at a new place, before
			// this ref, so it matches no later record.
			if e := &x.ents[id]; e.klen != 0 && e.kref == ref {
				kref, dst := heap.add(n)
				copy(dst, rec[:n])
				used += n
				e.kref = kref
			}
		}
	}
	for i, s := range x.slots {
		if s != 0 {
			id := recID(old[uint32(s)>>chunkBits][uint32(s)&chunkMask:])
			x.slots[i] = s&^0xffffffff | uint64(x.ents[id].kref)
		}
	}
	x.heap, x.used, x.hole = heap, used, 0
}

// reset empties the index, keeping nothing.
func (x *index) reset() {
	*x = index{}
	x.init()
}
