package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// worker is one goroutine of a concurrent subtest: its own slots of host
// memory, a seeded random source, and the first failure it reports.
type worker struct {
	t    testing.TB
	id   int
	rng  *rand.Rand
	mem  *memory
	stop *atomic.Bool // set by the first failure of any worker
}

func (w *worker) failf(format string, args ...any) {
	w.t.Errorf("worker %d: "+format, append([]any{w.id}, args...)...)
	w.stop.Store(true)
}

// concKeys returns n keys for the concurrent subtests, with a fixed size
// per key between 1 and max bytes.
func concKeys(tag string, n, max int) ([]string, map[string]int) {
	keys := make([]string, n)
	size := make(map[string]int, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("c@%s@%04d", tag, i)
		size[keys[i]] = 1 + int(hashString(keys[i])%uint64(max))
	}
	return keys, size
}

// iterations is the number of operations each worker does.
func iterations() int {
	if short() {
		return 100
	}
	return 400
}

// firstWriterWins has writers put different values under the same keys
// while readers read them. Half the keys hold a value before the race
// starts: it must stay. For the other half, each key must show one winner,
// the same to every reader. A store that evicts may drop a key and take a
// later writer's value, so for it only the values themselves are checked.
func (h *harness) firstWriterWins(t tester) {
	const writers, readers, nkeys = 3, 2, 32
	max := min(h.opts.MaxValueSize, int(h.opts.Capacity/nkeys))
	keys, size := concKeys("fww", nkeys, max)
	// The settled half is written before the race by a settler whose
	// value no racing writer puts, so a store that lets any later put
	// replace a value ends the race with a racer's value under a settled
	// key, whatever order the writers ran in.
	settled := keys[:nkeys/2]
	const settler = writers
	mems := make([]*memory, writers+readers)
	for i := range mems {
		mems[i] = newMemory(t, 1, max)
	}
	s := h.open(t, mems...)
	var stop atomic.Bool
	put := func(wk *worker, w int, key string) bool {
		res := make([]store.Result, 1)
		src := wk.mem.slot(0, size[key])
		fillValue(wk.mem.bytes(0), key, uint64(w+1))
		if err := s.Put(background, []string{key}, []rdma.Region{src}, res); err != nil {
			wk.failf("Put(%q) = %v, want nil", key, err)
			return false
		}
		if err := res[0].Err; err != nil && !(h.opts.Evicts && errors.Is(err, store.ErrNoSpace)) {
			wk.failf("Put(%q): %v, want nil", key, err)
			return false
		}
		return true
	}
	w0 := &worker{t: t, id: 0, mem: mems[0], stop: &stop}
	for _, key := range settled {
		if !put(w0, settler, key) {
			return
		}
	}
	var wg sync.WaitGroup
	seen := make([]map[string]int, readers) // per reader: key -> winning writer
	for w := range writers {
		wk := &worker{t: t, id: w, rng: rand.New(rand.NewPCG(1, uint64(w))), mem: mems[w], stop: &stop}
		wg.Go(func() {
			for _, k := range wk.rng.Perm(nkeys) {
				if stop.Load() || !put(wk, w, keys[k]) {
					return
				}
			}
		})
	}
	for r := range readers {
		wk := &worker{t: t, id: writers + r, rng: rand.New(rand.NewPCG(2, uint64(r))), mem: mems[writers+r], stop: &stop}
		seen[r] = map[string]int{}
		for _, key := range settled {
			seen[r][key] = settler
		}
		wg.Go(func() {
			res := make([]store.Result, 1)
			for range iterations() {
				if stop.Load() {
					return
				}
				key := keys[wk.rng.IntN(nkeys)]
				dst := wk.mem.slot(0, max)
				if err := s.Get(background, []string{key}, []rdma.Region{dst}, res); err != nil {
					wk.failf("Get(%q) = %v, want nil", key, err)
					return
				}
				if errors.Is(res[0].Err, store.ErrNotFound) {
					if _, ok := seen[r][key]; ok && !h.opts.Evicts {
						wk.failf("Get(%q): %v, but the key was stored and the store declares no eviction", key, res[0].Err)
						return
					}
					continue
				}
				if res[0].Err != nil {
					wk.failf("Get(%q): %v, want nil or store.ErrNotFound", key, res[0].Err)
					return
				}
				got := wk.mem.bytes(0)[:res[0].N]
				winner := -1
				for w := range writers + 1 { // the racers and the settler
					if len(got) == size[key] && bytes.Equal(got, value(key, uint64(w+1), size[key])) {
						winner = w
					}
				}
				if winner < 0 {
					wk.failf("Get(%q) returned %d bytes that are no writer's value (a torn or foreign value)", key, len(got))
					return
				}
				if prev, ok := seen[r][key]; ok && prev != winner && !h.opts.Evicts {
					wk.failf("Get(%q) returned writer %d's value after writer %d's: a later put replaced the first", key, winner, prev)
					return
				}
				seen[r][key] = winner
			}
		})
	}
	wait(t, "the writers and readers of FirstWriterWins", &wg)
	if stop.Load() || h.opts.Evicts {
		return
	}
	// Quiescent: every key holds the value its readers saw, and the keys
	// stored before the race hold the settler's (writer number `settler`).
	dst := mems[0]
	res := make([]store.Result, 1)
	for _, key := range keys {
		if err := s.Get(background, []string{key}, []rdma.Region{dst.slot(0, max)}, res); err != nil || res[0].Err != nil {
			t.Fatalf("after the writers: Get(%q) = %v, %v; want the key present", key, err, res[0].Err)
		}
		got := dst.bytes(0)[:res[0].N]
		for r := range readers {
			if w, ok := seen[r][key]; ok && !bytes.Equal(got, value(key, uint64(w+1), size[key])) {
				who := fmt.Sprintf("writer %d's value, the first one stored (as reader %d saw)", w, r)
				if w == settler {
					who = "the value stored before the race"
				}
				t.Fatalf("after the writers: Get(%q) does not return %s: a later put replaced it", key, who)
			}
		}
	}
}

// churn runs writers, readers, probers and removers over one key space,
// under eviction pressure when the store evicts. Every key has one value,
// so every successful get must return exactly it: a torn read, a read of
// memory freed or reused under it, shows as different bytes.
func (h *harness) churn(t tester) {
	const writers, readers, probers, removers = 2, 2, 1, 1
	const batch = 8
	maxv := h.opts.MaxValueSize
	n := int(h.opts.Capacity) / maxv
	if h.opts.Evicts {
		n = min(4096, 3*n+batch) // three times what fits
	} else {
		n = min(64, n)
	}
	keys, size := concKeys("churn", n, maxv)
	if h.opts.Evicts {
		for _, k := range keys {
			size[k] = maxv - int(hashString(k)%4)
		}
	}
	mems := make([]*memory, writers+readers+probers+removers)
	for i := range mems {
		mems[i] = newMemory(t, batch, maxv)
	}
	s := h.open(t, mems...)
	var stop atomic.Bool
	var wg sync.WaitGroup
	id := 0
	spawn := func(f func(w *worker)) {
		w := &worker{t: t, id: id, rng: rand.New(rand.NewPCG(3, uint64(id))), mem: mems[id], stop: &stop}
		id++
		wg.Go(func() {
			for range iterations() {
				if stop.Load() {
					return
				}
				f(w)
			}
		})
	}
	pick := func(w *worker) []string {
		ks := make([]string, 1+w.rng.IntN(batch))
		for i := range ks {
			ks[i] = keys[w.rng.IntN(len(keys))]
		}
		return ks
	}
	for range writers {
		spawn(func(w *worker) {
			ks := pick(w)
			src := make([]rdma.Region, len(ks))
			for i, k := range ks {
				src[i] = w.mem.slot(i, size[k])
				fillValue(w.mem.bytes(i), k, 0)
			}
			res := make([]store.Result, len(ks))
			if err := s.Put(background, ks, src, res); err != nil {
				w.failf("Put(%q) = %v, want nil", ks, err)
				return
			}
			for i, r := range res {
				if r.Err != nil && !(h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace)) {
					w.failf("Put(%q): key %q: %v, want nil", ks, ks[i], r.Err)
				}
			}
		})
	}
	for range readers {
		spawn(func(w *worker) {
			ks := pick(w)
			dst := make([]rdma.Region, len(ks))
			for i := range ks {
				dst[i] = w.mem.slot(i, maxv)
			}
			res := make([]store.Result, len(ks))
			if err := s.Get(background, ks, dst, res); err != nil {
				w.failf("Get(%q) = %v, want nil", ks, err)
				return
			}
			for i, r := range res {
				k := ks[i]
				switch {
				case errors.Is(r.Err, store.ErrNotFound):
				case r.Err != nil:
					w.failf("Get(%q): key %q: %v, want nil or store.ErrNotFound", ks, k, r.Err)
				case r.N != size[k] || !bytes.Equal(w.mem.bytes(i)[:r.N], value(k, 0, size[k])):
					w.failf("Get(%q): key %q: returned %d bytes that are not its value%s (torn, or memory reused while read)",
						ks, k, r.N, firstDiff(value(k, 0, size[k]), w.mem.bytes(i)[:r.N]))
				}
			}
		})
	}
	for range probers {
		spawn(func(w *worker) {
			ks := pick(w)
			res := make([]store.Result, len(ks))
			if err := s.Exists(background, ks, res); err != nil {
				w.failf("Exists(%q) = %v, want nil", ks, err)
				return
			}
			for i, r := range res {
				switch {
				case errors.Is(r.Err, store.ErrNotFound):
				case r.Err != nil:
					w.failf("Exists(%q): key %q: %v, want nil or store.ErrNotFound", ks, ks[i], r.Err)
				case r.N != size[ks[i]]:
					w.failf("Exists(%q): key %q: N = %d, want %d", ks, ks[i], r.N, size[ks[i]])
				}
			}
		})
	}
	for range removers {
		spawn(func(w *worker) {
			if w.rng.IntN(50) == 0 {
				prefix := fmt.Sprintf("c@churn@%03d", w.rng.IntN(len(keys)/10+1))
				if _, err := s.RemovePrefix(background, prefix); err != nil && !(h.opts.Leases && errors.Is(err, store.ErrHasLease)) {
					w.failf("RemovePrefix(%q) = %v, want nil", prefix, err)
				}
				return
			}
			k := keys[w.rng.IntN(len(keys))]
			if err := s.Remove(background, k); err != nil && !errors.Is(err, store.ErrNotFound) && !(h.opts.Leases && errors.Is(err, store.ErrHasLease)) {
				w.failf("Remove(%q) = %v, want nil or store.ErrNotFound", k, err)
			}
		})
	}
	wait(t, "the workers of Churn", &wg)
}

// closeWhileBusy closes a store while workers call it: calls that start
// after Close returned must fail with store.ErrClosed, and calls in flight
// must either complete correctly or fail the same way.
func (h *harness) closeWhileBusy(t tester) {
	const workers, warmup = 3, 20
	maxv := min(h.opts.MaxValueSize, 1024)
	keys, size := concKeys("close", 16, maxv)
	mems := make([]*memory, workers)
	for i := range mems {
		mems[i] = newMemory(t, 1, maxv)
	}
	s := h.open(t, mems...)
	var closed, stop atomic.Bool
	var started, wg sync.WaitGroup
	started.Add(workers)
	for id := range workers {
		w := &worker{t: t, id: id, rng: rand.New(rand.NewPCG(4, uint64(id))), mem: mems[id], stop: &stop}
		wg.Go(func() {
			res := make([]store.Result, 1)
			for i := 0; ; i++ {
				if i == warmup {
					started.Done()
				}
				if stop.Load() {
					if i < warmup {
						started.Done()
					}
					return
				}
				after := closed.Load() // Close had returned before this call
				k := keys[w.rng.IntN(len(keys))]
				var err error
				var op string
				switch w.rng.IntN(3) {
				case 0:
					op = "Put"
					fillValue(w.mem.bytes(0), k, 0)
					err = s.Put(background, []string{k}, []rdma.Region{w.mem.slot(0, size[k])}, res)
				case 1:
					op = "Get"
					err = s.Get(background, []string{k}, []rdma.Region{w.mem.slot(0, maxv)}, res)
				default:
					op = "Exists"
					err = s.Exists(background, []string{k}, res)
				}
				switch {
				case errors.Is(err, store.ErrClosed):
					if i < warmup {
						started.Done()
					}
					return
				case err != nil:
					w.failf("%s(%q) = %v, want nil or store.ErrClosed", op, k, err)
				case after:
					w.failf("%s(%q) after Close returned = nil, want store.ErrClosed", op, k)
				case res[0].Err == nil && op == "Get" && !bytes.Equal(w.mem.bytes(0)[:res[0].N], value(k, 0, size[k])):
					w.failf("Get(%q) while closing returned bytes that are not its value", k)
				case res[0].Err != nil && !errors.Is(res[0].Err, store.ErrNotFound) && !errors.Is(res[0].Err, store.ErrNoSpace) && !errors.Is(res[0].Err, store.ErrClosed):
					w.failf("%s(%q) while closing: key error %v", op, k, res[0].Err)
				}
				if after {
					return
				}
			}
		})
	}
	wait(t, fmt.Sprintf("the first %d calls of each worker, before Close", warmup), &started)
	err := s.Close()
	closed.Store(true)
	if err != nil {
		t.Errorf("Close() with calls in flight = %v, want nil", err)
	}
	wait(t, "the workers calling while Close ran", &wg)
}
