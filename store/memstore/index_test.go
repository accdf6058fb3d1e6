package memstore

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestIndexModel runs random inserts, lookups, removals (some of entries
// being read, released later) and compactions on an index against a map,
// and checks the heap's length and hole against the records it must
// hold. Hashes come from a small set, so that tags
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
				id := x.insert(k, h, size)
				if id == 0 {
					t.Fatalf("insert of %.20q refused", k)
				}
				model[k] = item{h, size, id}
				if x.hole == 0 && hole != 0 { // the insert compacted the heap
					hole = 0
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
				x.compact()
				hole = 0
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
