package memstore

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestIndexModel runs random inserts (some of hundreds of long keys, so
// that the heap spans chunks and inserts compact it), lookups, removals
// (some of entries being read, released later; some of most keys at once)
// and compactions on an index against a map, and checks the heap's
// length and hole against the records it must hold. Hashes come from a small set, so that tags
// collide, runs of the table wrap around and backward-shift deletion
// moves slots; values' sizes span the record's 48 bits.
func TestIndexModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var x index
		x.init()
		type item struct {
			h    uint64
			size int
			id   int32
		}
		model := map[string]item{}
		var pinned []int32 // removed while read: released later
		serial := 0        // keys made by insertMany
		hole := 0          // bytes of removed records since the last compaction
		live := func() int {
			n := 1 // the padding byte
			for k := range model {
				n += recHdr + len(k)
			}
			return n
		}
		hashGen := rapid.Custom(func(t *rapid.T) uint64 {
			// The low 32 bits are the tag and the home slot; few values
			// of each make tags and homes collide.
			lo := rapid.Uint64Range(0, 40).Draw(t, "tag")
			hi := rapid.Uint64Range(0, 3).Draw(t, "high")
			return hi<<32 | lo | lo<<28
		})
		keyGen := rapid.StringMatching(`[a-z]{1,6}|[a-z]{200,512}`)
		check := func() {
			if x.count != len(model) {
				t.Fatalf("count %d, want %d", x.count, len(model))
			}
			held := 0
			for _, c := range x.heap {
				held += len(c)
			}
			if x.hole != hole || x.used != live()+hole || held != x.used {
				t.Fatalf("heap of %d bytes (%d in %d chunks) with a hole of %d; want %d and %d", x.used, held, len(x.heap), x.hole, live()+hole, hole)
			}
			for k, it := range model {
				id, size := x.find(k, it.h)
				if id != it.id || size != it.size {
					t.Fatalf("find(%.20q) = entry %d, size %d; want entry %d, size %d", k, id, size, it.id, it.size)
				}
				if got := x.key(&x.ents[id]); got != k {
					t.Fatalf("key of entry %d = %.20q, want %.20q", id, got, k)
				}
				if got := x.size(id); got != it.size {
					t.Fatalf("size(%d) = %d, want %d", id, got, it.size)
				}
			}
			for _, id := range pinned {
				if x.ents[id].klen != 0 {
					t.Fatalf("entry %d, removed, is marked in the index", id)
				}
			}
		}
		remove := func(t *rapid.T, release bool) {
			if len(model) == 0 {
				t.Skip("empty")
			}
			k := rapid.SampledFrom(slices.Sorted(maps.Keys(model))).Draw(t, "key")
			it := model[k]
			x.remove(it.id, it.h)
			if release {
				x.release(it.id)
			} else {
				pinned = append(pinned, it.id)
			}
			delete(model, k)
			hole += recHdr + len(k)
			if id, _ := x.find(k, it.h); id != 0 {
				t.Fatalf("find of removed %.20q = entry %d", k, id)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				k := keyGen.Draw(t, "key")
				if _, ok := model[k]; ok {
					t.Skip("present")
				}
				h := hashGen.Draw(t, "hash")
				size := rapid.OneOf(rapid.IntRange(0, 1<<20), rapid.Just(maxSize)).Draw(t, "size")
				chunks := len(x.heap)
				id := x.insert(k, h, size)
				if id == 0 {
					t.Fatalf("insert of %.20q refused", k)
				}
				model[k] = item{h, size, id}
				if x.hole == 0 && hole != 0 { // the insert compacted the heap
					hole = 0
					if len(x.heap) > chunks+1 {
						t.Fatalf("an insert that compacted the heap left %d chunks of %d", len(x.heap), chunks)
					}
				}
			},
			"insertMany": func(t *rapid.T) {
				// Long keys, enough to fill chunks and, removed, to
				// make inserts compact the heap on their own.
				n := rapid.IntRange(1, 200).Draw(t, "n")
				for range n {
					serial++
					k := fmt.Sprintf("%0*d", 400+serial%113, serial)
					h := uint64(serial) * 0x9e3779b97f4a7c15
					chunks := len(x.heap)
					id := x.insert(k, h, serial)
					if id == 0 {
						t.Fatalf("insert of key %d refused", serial)
					}
					model[k] = item{h, serial, id}
					if x.hole == 0 && hole != 0 {
						hole = 0
						if len(x.heap) > chunks+1 {
							t.Fatalf("an insert that compacted the heap left %d chunks of %d", len(x.heap), chunks)
						}
					}
				}
			},
			"removeMany": func(t *rapid.T) {
				keys := slices.Sorted(maps.Keys(model))
				for i, k := range keys {
					if i%3 == 0 {
						continue
					}
					it := model[k]
					x.remove(it.id, it.h)
					x.release(it.id)
					delete(model, k)
					hole += recHdr + len(k)
				}
			},
			"findAbsent": func(t *rapid.T) {
				k := keyGen.Draw(t, "key")
				if _, ok := model[k]; ok {
					t.Skip("present")
				}
				if id, _ := x.find(k, hashGen.Draw(t, "hash")); id != 0 {
					t.Fatalf("find of absent %.20q = entry %d", k, id)
				}
			},
			"remove":          func(t *rapid.T) { remove(t, true) },
			"removeWhileRead": func(t *rapid.T) { remove(t, false) },
			"endRead": func(t *rapid.T) {
				if len(pinned) == 0 {
					t.Skip("no read")
				}
				i := rapid.IntRange(0, len(pinned)-1).Draw(t, "read")
				x.release(pinned[i])
				pinned = slices.Delete(pinned, i, i+1)
			},
			"compact": func(t *rapid.T) {
				chunks := len(x.heap)
				x.compact()
				hole = 0
				if len(x.heap) > chunks {
					t.Fatalf("compaction took %d chunks, from %d", len(x.heap), chunks)
				}
			},
			"": func(t *rapid.T) { check() },
		})
	})
}

// TestIndexRecordBytes pins the record layout: entry index, 48-bit size
// and key length, little endian, then the key.
func TestIndexRecordBytes(t *testing.T) {
	var x index
	x.init()
	id := x.insert("abc", 7, 0x0102030405)
	e := x.ents[id]
	got := fmt.Sprintf("% x", x.rec(e.kref)[:recHdr+3])
	want := fmt.Sprintf("%02x 00 00 00 05 04 03 02 01 00 03 00 61 62 63", id)
	if got != want {
		t.Fatalf("record = %s, want %s", got, want)
	}
	if e.kref == 0 {
		t.Fatal("a record at offset 0 makes its slot 0, which means empty")
	}
}

// TestIndexChunks fills a heap of several chunks, removes every other
// key, compacts it and checks that every key left is found, where no
// record straddles two chunks.
func TestIndexChunks(t *testing.T) {
	var x index
	x.init()
	key := func(i int) string { return fmt.Sprintf("%0*d", 100+i%400, i) }
	ids := map[int]int32{}
	const n = 2000
	for i := range n {
		if ids[i] = x.insert(key(i), uint64(i)*0x9e3779b97f4a7c15, i); ids[i] == 0 {
			t.Fatalf("insert %d refused", i)
		}
	}
	if len(x.heap) < 4 {
		t.Fatalf("%d chunks for %d bytes, want several", len(x.heap), x.used)
	}
	for i, c := range x.heap {
		if len(c) > chunkSize {
			t.Fatalf("chunk %d holds %d bytes, past %d", i, len(c), chunkSize)
		}
	}
	for i := 0; i < n; i += 2 {
		x.remove(ids[i], uint64(i)*0x9e3779b97f4a7c15)
		x.release(ids[i])
	}
	before := len(x.heap)
	x.compact()
	if len(x.heap) >= before {
		t.Fatalf("compaction kept %d chunks of %d", len(x.heap), before)
	}
	for i := range n {
		id, size := x.find(key(i), uint64(i)*0x9e3779b97f4a7c15)
		switch {
		case i%2 == 0 && id != 0:
			t.Fatalf("removed key %d found", i)
		case i%2 == 1 && (id != ids[i] || size != i || x.key(&x.ents[id]) != key(i)):
			t.Fatalf("key %d: entry %d, size %d; want entry %d, size %d", i, id, size, ids[i], i)
		}
	}
}

// TestIndexCompactionOrder: compaction packs the records in the heap's
// order, not in the entries' (which freed entries, reused newest first,
// make differ), so that it never needs more chunks than the heap had.
// Here two chunks are filled exactly; packed in the entries' order, the
// same records take three.
func TestIndexCompactionOrder(t *testing.T) {
	var x index
	x.init()
	x.limit = 2
	hash := func(k string) uint64 {
		return uint64(len(k))*0x9e3779b97f4a7c15 ^ uint64(k[len(k)-1])<<20 ^ uint64(k[len(k)-2])<<28
	}
	// Entries removed while read, then released: free entries, no hole.
	var freed []int32
	for i := range 300 {
		k := fmt.Sprintf("freed-%05d", i)
		id := x.insert(k, hash(k), 1)
		x.remove(id, hash(k))
		freed = append(freed, id)
	}
	x.compact()
	for _, id := range freed {
		x.release(id)
	}
	keys := []string{strings.Repeat("a", 35-recHdr)}
	for i := range 125 {
		keys = append(keys, fmt.Sprintf("%0512d", i))
	}
	keys = append(keys, strings.Repeat("b", 36-recHdr))
	for i := range 125 {
		keys = append(keys, fmt.Sprintf("%0512d", 1000+i))
	}
	for _, k := range keys {
		if x.insert(k, hash(k), len(k)) == 0 {
			t.Fatalf("insert of a %d-byte key refused with %d chunks", len(k), len(x.heap))
		}
	}
	if len(x.heap) != 2 || len(x.heap[0]) != chunkSize || len(x.heap[1]) != chunkSize {
		t.Fatalf("heap of %d chunks; want 2 full ones", len(x.heap))
	}
	x.compact()
	if len(x.heap) > 2 {
		t.Fatalf("compaction took %d chunks, from 2", len(x.heap))
	}
	for _, k := range keys {
		if id, size := x.find(k, hash(k)); id == 0 || size != len(k) || x.key(&x.ents[id]) != k {
			t.Fatalf("a %d-byte key: entry %d, size %d after compaction", len(k), id, size)
		}
	}
	// Full: the next insert is refused, and nothing is lost; a heap with
	// no hole is not compacted for nothing.
	first := &x.heap[1][0]
	if id := x.insert("one-more", hash("one-more"), 1); id != 0 {
		t.Fatalf("insert into a full heap of %d chunks = entry %d, want refused", len(x.heap), id)
	}
	if &x.heap[1][0] != first {
		t.Fatal("a refused insert compacted a heap with no hole")
	}
	if x.count != len(keys) {
		t.Fatalf("%d keys after a refused insert, want %d", x.count, len(keys))
	}
}

// TestIndexCompactsItself: once removed records are most of the heap, and
// more than a chunk, an insert compacts it.
func TestIndexCompactsItself(t *testing.T) {
	var x index
	x.init()
	hash := func(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }
	key := func(i int) string { return fmt.Sprintf("%0500d", i) }
	ids := make([]int32, 1000)
	for i := range ids {
		ids[i] = x.insert(key(i), hash(i), i)
	}
	for i := range 900 {
		x.remove(ids[i], hash(i))
		x.release(ids[i])
	}
	if x.hole < x.used/2 {
		t.Fatalf("hole of %d bytes in %d: the test needs more than half", x.hole, x.used)
	}
	before := x.used
	x.insert(key(1000), hash(1000), 1000)
	if x.hole != 0 || x.used > before/4 {
		t.Fatalf("after an insert: heap of %d bytes (%d before), hole %d; want it compacted", x.used, before, x.hole)
	}
	for i := 900; i <= 1000; i++ {
		if id, size := x.find(key(i), hash(i)); id == 0 || size != i {
			t.Fatalf("key %d: entry %d, size %d after compaction", i, id, size)
		}
	}
}

// TestIndexFullHeap: a full heap refuses an insert, and is compacted to
// make room once a chunk's worth of its records are removed, not before
// (which would copy the whole heap at every put while keys come and go).
func TestIndexFullHeap(t *testing.T) {
	var x index
	x.init()
	x.limit = 3
	hash := func(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }
	key := func(i int) string { return fmt.Sprintf("%0512d", i) }
	n := 0
	for ; x.insert(key(n), hash(n), n) != 0; n++ {
	}
	if len(x.heap) != 3 || n != 3*(chunkSize/(recHdr+512)) {
		t.Fatalf("%d keys in %d chunks before the first refusal; want %d in 3", n, len(x.heap), 3*(chunkSize/(recHdr+512)))
	}
	first := &x.heap[2][0]
	remove := func(i int) {
		id, _ := x.find(key(i), hash(i))
		x.remove(id, hash(i))
		x.release(id)
	}
	remove(0)
	if id := x.insert(key(n), hash(n), n); id != 0 || &x.heap[2][0] != first {
		t.Fatalf("insert with a hole of %d bytes = entry %d (compacted: %v); want refused, not compacted", x.hole, id, &x.heap[2][0] != first)
	}
	for i := 1; i <= chunkSize/(recHdr+512); i++ {
		remove(i)
	}
	if x.hole < chunkSize || x.hole > x.used/2 {
		t.Fatalf("hole of %d bytes in %d: the test needs one of a chunk at least, and less than half", x.hole, x.used)
	}
	if id := x.insert(key(n), hash(n), n); id == 0 {
		t.Fatalf("insert refused with a hole of %d bytes in a full heap", x.hole)
	}
	for i := 0; i <= n; i++ {
		if id, _ := x.find(key(i), hash(i)); (id == 0) != (i <= chunkSize/(recHdr+512)) {
			t.Fatalf("key %d after compaction: entry %d", i, id)
		}
	}
}
