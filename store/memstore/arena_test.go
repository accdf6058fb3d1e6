package memstore

import (
	"testing"

	"pgregory.net/rapid"
)

// checkArena verifies the allocator's structure: the extents tile the
// arena in address order, free extents never touch (they would have been
// merged), each free extent sits in the bucket of its size, and used
// counts the units of used extents.
func checkArena(t interface{ Fatalf(string, ...any) }, a *arena) {
	var next, used int64
	prev := int32(nilNode)
	head := int32(nilNode)
	for i := range a.nodes {
		if a.nodes[i].n > 0 && a.nodes[i].prev == nilNode {
			if head != nilNode {
				t.Fatalf("two extents without a predecessor: %d and %d", head, i)
			}
			head = int32(i)
		}
	}
	free := map[int32]bool{}
	for i := head; i != nilNode; i = a.nodes[i].next {
		e := a.nodes[i]
		if e.start != next || e.n <= 0 || e.prev != prev {
			t.Fatalf("extent %d = %+v, want start %d, prev %d and a positive size", i, e, next, prev)
		}
		if e.free {
			if prev != nilNode && a.nodes[prev].free {
				t.Fatalf("free extents %d and %d touch", prev, i)
			}
			free[i] = true
		} else {
			used += e.n
		}
		next += e.n
		prev = i
	}
	if next != a.units || used != a.used {
		t.Fatalf("extents cover %d units (%d used), want %d (%d used)", next, used, a.units, a.used)
	}
	for b := range a.heads {
		nonEmpty := a.nonEmpty[b/64]&(1<<(b%64)) != 0
		if nonEmpty != (a.heads[b] != nilNode) {
			t.Fatalf("bucket %d: bitmap says non-empty %v, head %d", b, nonEmpty, a.heads[b])
		}
		for i := a.heads[b]; i != nilNode; i = a.nodes[i].fnext {
			if !free[i] || bucketOf(a.nodes[i].n) != b {
				t.Fatalf("bucket %d holds extent %d = %+v", b, i, a.nodes[i])
			}
			delete(free, i)
		}
	}
	if len(free) != 0 {
		t.Fatalf("free extents in no bucket: %v", free)
	}
}

func TestBucketOf(t *testing.T) {
	prev := 0
	for n := int64(1); n < 1<<20; n++ {
		b := bucketOf(n)
		if b < prev || b >= nBuckets {
			t.Fatalf("bucketOf(%d) = %d after %d: buckets must grow with size and stay below %d", n, b, prev, nBuckets)
		}
		prev = b
	}
	if b := bucketOf(1<<63 - 1); b >= nBuckets {
		t.Fatalf("bucketOf(max) = %d, want < %d", b, nBuckets)
	}
}

// TestArenaModel allocates and frees at random against a model of which
// units are in use: extents never overlap, allocation fails only when no
// free run is long enough, and freeing everything leaves one free extent.
func TestArenaModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		units := rapid.Int64Range(1, 4096).Draw(t, "units")
		a := newArena(units)
		inUse := make([]bool, units)
		var live []int32
		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				n := rapid.OneOf(rapid.Int64Range(1, 16), rapid.Int64Range(1, units)).Draw(t, "n")
				i := a.alloc(n)
				longest, run := int64(0), int64(0)
				for _, u := range inUse {
					if u {
						run = 0
					} else {
						run++
						longest = max(longest, run)
					}
				}
				if i == nilNode {
					if longest >= n {
						t.Fatalf("alloc(%d) failed with a free run of %d units", n, longest)
					}
					return
				}
				e := a.nodes[i]
				if e.n != n {
					t.Fatalf("alloc(%d) returned %d units", n, e.n)
				}
				for u := e.start; u < e.start+n; u++ {
					if inUse[u] {
						t.Fatalf("alloc(%d) returned unit %d, already in use", n, u)
					}
					inUse[u] = true
				}
				live = append(live, i)
			},
			"free": func(t *rapid.T) {
				if len(live) == 0 {
					t.Skip("nothing to free")
				}
				k := rapid.IntRange(0, len(live)-1).Draw(t, "k")
				i := live[k]
				e := a.nodes[i]
				for u := e.start; u < e.start+e.n; u++ {
					inUse[u] = false
				}
				a.free(i)
				live = append(live[:k], live[k+1:]...)
			},
			"": func(t *rapid.T) { checkArena(t, a) },
		})
		for _, i := range live {
			a.free(i)
		}
		checkArena(t, a)
		if count, largest := a.freeStats(); count != 1 || largest != units || a.used != 0 {
			t.Fatalf("after freeing everything: %d free extents, largest %d, used %d; want one of %d, used 0", count, largest, a.used, units)
		}
	})
}

// TestArenaSameSizeNoFragmentation fills an arena with equal extents,
// frees every other one, and refills: all of it is reused, exactly.
func TestArenaSameSizeNoFragmentation(t *testing.T) {
	const n, size = 100, 4096 >> unitShift
	a := newArena(n * size)
	ids := make([]int32, n)
	for i := range ids {
		if ids[i] = a.alloc(size); ids[i] == nilNode {
			t.Fatalf("alloc %d of %d failed", i, n)
		}
	}
	if a.alloc(1) != nilNode {
		t.Fatal("alloc in a full arena succeeded")
	}
	for i := 0; i < n; i += 2 {
		a.free(ids[i])
	}
	for i := 0; i < n; i += 2 {
		if ids[i] = a.alloc(size); ids[i] == nilNode {
			t.Fatalf("realloc %d failed with %d free units", i, a.units-a.used)
		}
	}
	if a.used != a.units {
		t.Fatalf("used %d of %d units after refilling", a.used, a.units)
	}
	checkArena(t, a)
}
