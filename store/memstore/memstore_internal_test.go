package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

var bg = context.Background()

// rig is a store and host memory cut into slots of one value each.
type rig struct {
	t    *testing.T
	s    *Store
	mem  *rdma.HostMemory
	size int
}

func newRig(t *testing.T, cfg Config, slots, size int) *rig {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := rdma.AllocHost(slots * size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if err := mem.Free(); err != nil {
			t.Error(err)
		}
	})
	return &rig{t: t, s: s, mem: mem, size: size}
}

func (r *rig) slot(i int) rdma.Region {
	reg, err := r.mem.Region().Sub(i*r.size, r.size)
	if err != nil {
		r.t.Fatal(err)
	}
	return reg
}

// fill writes a pattern of key into slot i and returns it.
func (r *rig) fill(i int, key string) []byte {
	b := r.slot(i).Bytes()
	for j := range b {
		b[j] = byte(len(key)*31 + int(key[len(key)-1])*7 + j)
	}
	return bytes.Clone(b)
}

func (r *rig) put(key string, slot int) error {
	r.t.Helper()
	res := make([]store.Result, 1)
	if err := r.s.Put(bg, []string{key}, []rdma.Region{r.slot(slot)}, res); err != nil {
		r.t.Fatalf("Put(%q) = %v", key, err)
	}
	return res[0].Err
}

func (r *rig) get(key string, slot int) ([]byte, error) {
	res := make([]store.Result, 1)
	if err := r.s.Get(bg, []string{key}, []rdma.Region{r.slot(slot)}, res); err != nil {
		return nil, err
	}
	if res[0].Err != nil {
		return nil, res[0].Err
	}
	return bytes.Clone(r.slot(slot).Bytes()[:res[0].N]), nil
}

func (r *rig) present(key string) bool {
	res := make([]store.Result, 1)
	if err := r.s.Exists(bg, []string{key}, res); err != nil {
		r.t.Fatalf("Exists(%q) = %v", key, err)
	}
	return res[0].Err == nil
}

func (r *rig) used() int64 {
	r.s.alloc.Lock()
	defer r.s.alloc.Unlock()
	return r.s.alloc.a.used << unitShift
}

// blockGet starts a Get of key into slot that stops after pinning the
// entry, before copying. It returns when the Get is stopped there, and a
// function that lets it finish and returns what it read.
func (r *rig) blockGet(key string, slot int) (release func() ([]byte, error)) {
	r.t.Helper()
	pinned := make(chan struct{})
	proceed := make(chan struct{})
	var once sync.Once
	r.s.copyHook = func(k string) {
		if k == key {
			once.Do(func() {
				close(pinned)
				<-proceed
			})
		}
	}
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := r.get(key, slot)
		done <- result{b, err}
	}()
	<-pinned
	return func() ([]byte, error) {
		close(proceed)
		res := <-done
		return res.b, res.err
	}
}

// TestEvictionSkipsEntriesBeingRead fills the store past its watermark
// while a Get is stopped in the middle of reading one entry: every other
// entry may go, that one may not, and the Get returns its exact bytes.
func TestEvictionSkipsEntriesBeingRead(t *testing.T) {
	const size = 4096
	r := newRig(t, Config{Capacity: 16 * size, Shards: 4}, 64, size)
	want := r.fill(0, "pinned")
	if err := r.put("pinned", 0); err != nil {
		t.Fatal(err)
	}
	release := r.blockGet("pinned", 1)
	for i := range 40 {
		key := fmt.Sprintf("filler%02d", i)
		r.fill(2, key)
		if err := r.put(key, 2); err != nil {
			t.Fatalf("Put(%q) = %v, want room made by evicting unpinned entries", key, err)
		}
	}
	if st := r.s.Stats(); st.Evictions < 20 {
		t.Fatalf("Stats().Evictions = %d after 40 puts into room for 16, want at least 20", st.Evictions)
	}
	if !r.present("pinned") {
		t.Fatal("the entry being read was evicted")
	}
	got, err := release()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Get of the pinned entry = %v, %d bytes differing: %v; want its value", err, len(got), !bytes.Equal(got, want))
	}
}

// TestRemoveWhileReading removes an entry while a Get reads it: the key is
// gone at once, its memory is freed only when the Get ends, and the Get
// returns the exact bytes even though new values were stored meanwhile.
func TestRemoveWhileReading(t *testing.T) {
	const size = 4096
	r := newRig(t, Config{Capacity: 8 * size, HighWatermark: 1, Shards: 2}, 8, size)
	want := r.fill(0, "doomed")
	if err := r.put("doomed", 0); err != nil {
		t.Fatal(err)
	}
	release := r.blockGet("doomed", 1)
	if err := r.s.Remove(bg, "doomed"); err != nil {
		t.Fatalf("Remove of an entry being read = %v, want nil", err)
	}
	if r.present("doomed") {
		t.Fatal("a removed entry is still present while being read")
	}
	if st := r.s.Stats(); st.Keys != 0 || st.Bytes != 0 {
		t.Fatalf("Stats() = %+v after the only key was removed, want no keys", st)
	}
	if got := r.used(); got != size {
		t.Fatalf("memory in use = %d while the removed entry is read, want %d", got, size)
	}
	for i := range 7 { // fill the rest: the doomed value's memory must not be handed out
		key := fmt.Sprintf("new%d", i)
		r.fill(2, key)
		if err := r.put(key, 2); err != nil {
			t.Fatalf("Put(%q) = %v", key, err)
		}
	}
	got, err := release()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Get of a removed entry = %v, bytes equal %v; want its value", err, bytes.Equal(got, want))
	}
	if got := r.used(); got != 7*size {
		t.Fatalf("memory in use = %d after the read ended, want %d (the removed value freed)", got, 7*size)
	}
}

// TestNoSpaceWhenAllPinned fills a store with one value being read: a put
// that needs its memory is refused, and counted.
func TestNoSpaceWhenAllPinned(t *testing.T) {
	const size = 60 << 10
	r := newRig(t, Config{Capacity: 64 << 10}, 3, size)
	r.fill(0, "big")
	if err := r.put("big", 0); err != nil {
		t.Fatal(err)
	}
	release := r.blockGet("big", 1)
	r.fill(2, "other")
	if err := r.put("other", 2); !errors.Is(err, store.ErrNoSpace) {
		t.Errorf("Put with all memory being read = %v, want store.ErrNoSpace", err)
	}
	if _, err := release(); err != nil {
		t.Fatal(err)
	}
	if err := r.put("other", 2); err != nil {
		t.Errorf("Put once the read ended = %v, want nil (the old value evicted)", err)
	}
	st := r.s.Stats()
	if st.RejectedPuts != 1 || st.Evictions != 1 || st.Keys != 1 {
		t.Errorf("Stats() = %+v, want 1 rejected put, 1 eviction, 1 key", st)
	}
}

// TestCloseWaitsForReads closes the store while a Get is stopped in its
// copy: Close must not unmap the memory before the Get ends.
func TestCloseWaitsForReads(t *testing.T) {
	const size = 4096
	r := newRig(t, Config{Capacity: 4 * size}, 2, size)
	want := r.fill(0, "k")
	if err := r.put("k", 0); err != nil {
		t.Fatal(err)
	}
	release := r.blockGet("k", 1)
	closed := make(chan error, 1)
	go func() { closed <- r.s.Close() }()
	for r.s.life.TryRLock() { // until Close waits for the lock
		r.s.life.RUnlock()
		runtime.Gosched()
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a Get was copying", err)
	default:
	}
	got, err := release()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Get during Close = %v, bytes equal %v; want its value", err, bytes.Equal(got, want))
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	if reg := r.s.mem.Region(); reg.Len != 0 {
		t.Errorf("memory still mapped after Close: %+v", reg)
	}
	if _, err := r.get("k", 1); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Get after Close = %v, want store.ErrClosed", err)
	}
}

// TestEvictionOrder checks least-recently-used order across shards: with
// room for four values, reading the oldest saves it, and the next oldest
// goes first.
func TestEvictionOrder(t *testing.T) {
	const size = 16 << 10
	for _, shards := range []int{1, 3, 64} {
		t.Run(fmt.Sprint(shards, "shards"), func(t *testing.T) {
			r := newRig(t, Config{Capacity: 4 * size, HighWatermark: 1, EvictRatio: 0.01, Shards: shards}, 2, size)
			for _, k := range []string{"a", "b", "c", "d"} {
				r.fill(0, k)
				if err := r.put(k, 0); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.get("a", 1); err != nil {
				t.Fatal(err)
			}
			for _, step := range []struct{ put, gone string }{{"e", "b"}, {"f", "c"}, {"g", "d"}, {"h", "a"}} {
				r.fill(0, step.put)
				if err := r.put(step.put, 0); err != nil {
					t.Fatal(err)
				}
				var present []string
				for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
					if r.present(k) {
						present = append(present, k)
					}
				}
				if r.present(step.gone) || len(present) != 4 {
					t.Fatalf("after Put(%q): present %q, want 4 keys without %q", step.put, present, step.gone)
				}
			}
		})
	}
}

// TestConcurrentPutsOfOneKey races puts of different values under one key:
// one wins, and the losers' memory is freed.
func TestConcurrentPutsOfOneKey(t *testing.T) {
	const size, writers = 4096, 8
	r := newRig(t, Config{Capacity: 1 << 20}, writers+1, size)
	vals := make([][]byte, writers)
	for w := range writers {
		b := r.slot(w).Bytes()
		for i := range b {
			b[i] = byte(w)
		}
		vals[w] = bytes.Clone(b)
	}
	for round := range 20 {
		key := fmt.Sprint("race", round)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				res := make([]store.Result, 1)
				if err := r.s.Put(bg, []string{key}, []rdma.Region{r.slot(w)}, res); err != nil || res[0].Err != nil {
					t.Errorf("Put(%q) = %v, %v", key, err, res[0].Err)
				}
			})
		}
		wg.Wait()
		got, err := r.get(key, writers)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] >= writers || !bytes.Equal(got, vals[got[0]]) {
			t.Fatalf("Get(%q) returned a value no writer wrote", key)
		}
		if used := r.used(); used != int64(round+1)*size {
			t.Fatalf("memory in use = %d after %d keys, want %d: losing puts leaked", used, round+1, int64(round+1)*size)
		}
	}
	st := r.s.Stats()
	if st.Puts != 20 || st.Duplicates != 20*(writers-1) {
		t.Errorf("Stats() = %+v, want 20 puts and %d duplicates", st, 20*(writers-1))
	}
}

// TestRemoveAllFreesEverything stores values of many sizes, removes them
// all, and checks that the arena is whole again.
func TestRemoveAllFreesEverything(t *testing.T) {
	r := newRig(t, Config{Capacity: 1 << 20}, 1, 8192)
	for i := range 100 {
		reg, err := r.slot(0).Sub(0, 1+i*79%8192)
		if err != nil {
			t.Fatal(err)
		}
		res := make([]store.Result, 1)
		if err := r.s.Put(bg, []string{fmt.Sprint("k", i)}, []rdma.Region{reg}, res); err != nil || res[0].Err != nil {
			t.Fatalf("Put = %v, %v", err, res[0].Err)
		}
		if i%3 == 0 {
			if err := r.s.Remove(bg, fmt.Sprint("k", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := r.s.RemoveAll(bg)
	if err != nil || n != 66 {
		t.Fatalf("RemoveAll() = %d, %v; want 66, nil", n, err)
	}
	r.s.alloc.Lock()
	checkArena(t, r.s.alloc.a)
	count, largest := r.s.alloc.a.freeStats()
	r.s.alloc.Unlock()
	if count != 1 || largest<<unitShift != 1<<20 {
		t.Errorf("after RemoveAll: %d free extents, largest %d bytes; want one of the whole capacity", count, largest<<unitShift)
	}
}

// TestExistsDoesNotHoldEntries probes every key of a full store, then
// stores as much again: Exists pins nothing, so every put finds room, and
// a probed key may be gone by the time it is read.
func TestExistsDoesNotHoldEntries(t *testing.T) {
	const size, n = 4096, 16
	r := newRig(t, Config{Capacity: n * size, HighWatermark: 1}, 2, size)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("old", i)
		r.fill(0, keys[i])
		if err := r.put(keys[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	res := make([]store.Result, n)
	if err := r.s.Exists(bg, keys, res); err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		if x.Err != nil || x.N != size {
			t.Fatalf("Exists(%q) = %d, %v; want present", keys[i], x.N, x.Err)
		}
	}
	for i := range n {
		key := fmt.Sprint("new", i)
		r.fill(1, key)
		if err := r.put(key, 1); err != nil {
			t.Fatalf("Put(%q) after every key was probed = %v, want nil", key, err)
		}
	}
	if _, err := r.get(keys[0], 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(%q) of a probed key after the store turned over = %v, want store.ErrNotFound", keys[0], err)
	}
	if st := r.s.Stats(); st.RejectedPuts != 0 || st.Evictions != n {
		t.Errorf("Stats() = %+v, want no rejected puts and %d evictions", st, n)
	}
}

// TestCancelMidBatch cancels the context while a batch get copies its
// second key: that copy completes, the keys after it fail with the
// context's error, and the call itself succeeds.
func TestCancelMidBatch(t *testing.T) {
	const size = 4096
	r := newRig(t, Config{Capacity: 1 << 20}, 4, size)
	keys := []string{"k0", "k1", "k2"}
	for _, k := range keys {
		r.fill(0, k)
		if err := r.put(k, 0); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	r.s.copyHook = func(k string) {
		if k == "k1" {
			cancel()
		}
	}
	res := make([]store.Result, 3)
	if err := r.s.Get(ctx, keys, []rdma.Region{r.slot(1), r.slot(2), r.slot(3)}, res); err != nil {
		t.Fatalf("Get canceled in the middle = %v, want per-key results", err)
	}
	if res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, context.Canceled) {
		t.Errorf("Get canceled at the second key: results %v, %v, %v; want nil, nil, context.Canceled", res[0].Err, res[1].Err, res[2].Err)
	}
	if st := r.s.Stats(); st.Hits != 2 {
		t.Errorf("Stats().Hits = %d, want 2", st.Hits)
	}
}

// TestKeysDoNotPinTheBatchString puts keys that are substrings of one
// string, as callers build a batch's keys: the store keeps copies of its
// own, so no entry shares (and keeps alive) the memory of that string.
func TestKeysDoNotPinTheBatchString(t *testing.T) {
	r := newRig(t, Config{Capacity: 1 << 20, Shards: 2}, 4, 64)
	batch := strings.Repeat("x", 1000) + "tenant/ns/0/aa" + "tenant/ns/0/bb" + "tenant/ns/1/aa"
	var keys []string
	for i := range 3 {
		keys = append(keys, batch[1000+14*i:1000+14*(i+1)])
	}
	src := []rdma.Region{r.slot(0), r.slot(1), r.slot(2)}
	res := make([]store.Result, 3)
	if err := r.s.Put(bg, keys, src, res); err != nil {
		t.Fatal(err)
	}
	vsrc := [][]rdma.Region{{r.slot(3)}}
	vkey := batch[1000 : 1000+13] // "tenant/ns/0/a", through PutV
	if err := r.s.PutV(bg, []string{vkey}, vsrc, res[:1]); err != nil {
		t.Fatal(err)
	}
	lo := uintptr(unsafe.Pointer(unsafe.StringData(batch)))
	hi := lo + uintptr(len(batch))
	inBatch := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return p >= lo && p < hi
	}
	found := 0
	for i := range r.s.shards {
		sh := &r.s.shards[i]
		sh.mu.Lock()
		for id := 1; id < len(sh.ix.ents); id++ {
			e := &sh.ix.ents[id]
			if e.klen == 0 {
				continue
			}
			found++
			if k := sh.ix.key(e); inBatch(k) {
				t.Errorf("entry %q: its key is in the batch string; want a copy", k)
			}
		}
		sh.mu.Unlock()
	}
	if found != 4 {
		t.Fatalf("found %d entries, want 4", found)
	}
	if !inBatch(keys[0]) {
		t.Fatal("the test's keys are not substrings of the batch string; the check cannot fail")
	}
}
