package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// removalGroups and removalPerGroup shape the keys of the Removal
// subtest: RemovePrefix takes a group at a time.
const removalGroups, removalPerGroup = 8, 8

// removal runs readers against a remover that takes keys away with
// Remove, RemovePrefix and RemoveAll, while writers put them back. Every
// value has the same size and is a function of its key alone, so the
// memory a removal frees is the right size for the next put of another
// key: a store that frees a value under a read in flight, or lets a put
// reuse it, shows a read with another key's bytes, whole or in part. Every
// successful get must return exactly its key's value. A correct store
// passes however the goroutines interleave; a store that tears reads under
// removal fails with near certainty, as every read overlaps some removal.
func (h *harness) removal(t tester) {
	const readers, writers, batch = 3, 1, 4
	n := removalGroups * removalPerGroup
	size := int(min(int64(h.opts.MaxValueSize), h.opts.Capacity/int64(2*n)))
	if size < 16 {
		t.Skipf("storetest: Options.Capacity %d holds too little for %d values of 16 bytes", h.opts.Capacity, 2*n)
	}
	keys := make([]string, n)
	owner := make(map[uint64]string, n) // first word of each value: its key
	for g := range removalGroups {
		for i := range removalPerGroup {
			k := fmt.Sprintf("rm@g%d@%02d", g, i)
			keys[g*removalPerGroup+i] = k
			owner[firstWord(value(k, 0, size))] = k
		}
	}
	mems := make([]*memory, readers+writers+1)
	for i := range mems {
		mems[i] = newMemory(t, 2*batch, size)
	}
	s := h.open(t, mems...)

	var stop, read atomic.Bool     // read: the readers are done
	var removed, left atomic.Int64 // keys removals took, and reported leaving
	var hits atomic.Int64
	var wg, readersWG sync.WaitGroup
	id := 0
	// Readers do a number of gets; writers and the remover work for as
	// long as the readers do, so that every get overlaps their calls.
	spawn := func(reader bool, f func(w *worker)) {
		w := &worker{t: t, id: id, rng: rand.New(rand.NewPCG(5, uint64(id))), mem: mems[id], stop: &stop}
		id++
		if reader {
			readersWG.Add(1)
		}
		wg.Go(func() {
			if reader {
				defer readersWG.Done()
			}
			for i := 0; reader && i < iterations() || !reader && !read.Load(); i++ {
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
			ks[i] = keys[w.rng.IntN(n)]
		}
		return ks
	}
	put := func(w *worker, ks []string) { // from slots batch on
		src := make([]rdma.Region, len(ks))
		for i, k := range ks {
			src[i] = w.mem.slot(batch+i, size)
			fillValue(w.mem.bytes(batch+i), k, 0)
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
	}
	for i := 0; i < n; i += batch { // every value before the race
		put(&worker{t: t, mem: mems[0], stop: &stop}, keys[i:i+batch])
	}
	for range readers {
		spawn(true, func(w *worker) {
			ks := pick(w)
			dst := make([]rdma.Region, len(ks))
			for i := range ks {
				canary(w.mem.bytes(i))
				dst[i] = w.mem.slot(i, size)
			}
			res := make([]store.Result, len(ks))
			if err := s.Get(background, ks, dst, res); err != nil {
				w.failf("Get(%q) = %v, want nil", ks, err)
				return
			}
			var absent []string // put back, so that most reads find a value
			for i, r := range res {
				k := ks[i]
				switch {
				case errors.Is(r.Err, store.ErrNotFound):
					absent = append(absent, k)
				case h.opts.Leases && errors.Is(r.Err, store.ErrLeaseExpired):
				case r.Err != nil:
					w.failf("Get(%q): key %q during removals: %v, want its value, store.ErrNotFound or store.ErrLeaseExpired", ks, k, r.Err)
				default:
					hits.Add(1)
					if got := w.mem.bytes(i)[:r.N]; r.N != size || !bytes.Equal(got, value(k, 0, size)) {
						w.failf("Get(%q): key %q during removals returned %d bytes that are not its value: %s",
							ks, k, r.N, whose(k, got, size, keys, owner))
					}
				}
			}
			if len(absent) > 0 {
				put(w, absent)
			}
		})
	}
	for range writers {
		spawn(false, func(w *worker) { put(w, pick(w)) })
	}
	spawn(false, func(w *worker) {
		switch r := w.rng.IntN(64); {
		case r == 0:
			cnt, err := s.RemoveAll(background)
			removed.Add(int64(cnt))
			h.checkRemoval(w, "RemoveAll()", cnt, err, n, &left)
		case r <= 4:
			prefix := fmt.Sprintf("rm@g%d@", w.rng.IntN(removalGroups))
			cnt, err := s.RemovePrefix(background, prefix)
			removed.Add(int64(cnt))
			h.checkRemoval(w, fmt.Sprintf("RemovePrefix(%q)", prefix), cnt, err, removalPerGroup, &left)
		default:
			k := keys[w.rng.IntN(n)]
			err := s.Remove(background, k)
			switch {
			case err == nil:
				removed.Add(1)
			case errors.Is(err, store.ErrNotFound):
			case h.opts.Leases && errors.Is(err, store.ErrHasLease):
				left.Add(1)
			default:
				w.failf("Remove(%q) during reads = %v, want nil or store.ErrNotFound", k, err)
			}
		}
	})
	wait(t, "the readers' gets during removals", &readersWG)
	read.Store(true)
	wait(t, "the writers and the remover, once the readers were done", &wg)
	t.Logf("Removal: %d keys removed, %d reported left under a lease, %d values read while removing", removed.Load(), left.Load(), hits.Load())
	if stop.Load() || h.opts.Leases {
		return
	}
	// Quiescent: RemoveAll takes every key.
	if _, err := s.RemoveAll(background); err != nil {
		t.Fatalf("RemoveAll() after the race = %v, want nil", err)
	}
	res := make([]store.Result, n)
	if err := s.Exists(background, keys, res); err != nil {
		t.Fatalf("Exists after RemoveAll = %v, want nil", err)
	}
	for i, r := range res {
		if !errors.Is(r.Err, store.ErrNotFound) {
			t.Fatalf("after RemoveAll: Exists(%q) = {N: %d, Err: %v}, want store.ErrNotFound", keys[i], r.N, r.Err)
		}
	}
}

// checkRemoval checks the outcome of a RemovePrefix or RemoveAll during the
// race: a count of at most max keys, and no error, or with leases one
// that matches store.ErrHasLease (then counted in left).
func (h *harness) checkRemoval(w *worker, call string, n int, err error, max int, left *atomic.Int64) {
	switch {
	case err != nil && !(h.opts.Leases && errors.Is(err, store.ErrHasLease)):
		w.failf("%s during reads = %d, %v; want a nil error", call, n, err)
	case n < 0 || n > max:
		w.failf("%s during reads = %d, want 0 to %d", call, n, max)
	case err != nil:
		left.Add(1)
	}
}

// firstWord is the first eight bytes of a value (or fewer), for finding
// whose value some bytes are.
func firstWord(b []byte) uint64 {
	var w uint64
	for i := range min(8, len(b)) {
		w |= uint64(b[i]) << (8 * i)
	}
	return w
}

// whose says what got is, read for key: another key's value, key's value
// torn by another's, or bytes of no key.
func whose(key string, got []byte, size int, keys []string, owner map[uint64]string) string {
	want := value(key, 0, size)
	if len(got) != size {
		return fmt.Sprintf("%d bytes, want %d%s", len(got), size, firstDiff(want, got))
	}
	if o, ok := owner[firstWord(got)]; ok && o != key && bytes.Equal(got, value(o, 0, size)) {
		return fmt.Sprintf("they are key %q's value (another key's bytes, in memory reused under the read)", o)
	}
	at := 0
	for at < size && got[at] == want[at] {
		at++
	}
	for _, o := range keys {
		if o != key && bytes.Equal(got[at:], value(o, 0, size)[at:]) {
			return fmt.Sprintf("a torn value: its first %d bytes are its value, the rest are key %q's", at, o)
		}
	}
	return fmt.Sprintf("a torn value: its first %d bytes are its value, the rest belong to no key", at)
}
