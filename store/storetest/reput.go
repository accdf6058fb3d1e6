package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// reput removes a key and puts it again with another value, of another
// size, many times: first alone, where every get after a put must return
// the new value and every get after a remove must find nothing; then with
// readers beside the writer, where every get returns one of the values the
// key held, whole, and the last get the value the writer left. A store
// that keeps a removed key's entry (its size, its place, its bytes, or the
// first writer's claim to it) shows an old value or a torn one.
func (h *harness) reput(t tester) {
	const readers = 3
	maxv := min(h.opts.MaxValueSize, 4096)
	sizeOf := func(v int) int { return 16 + (v*97)%(maxv-15) }
	key := "reput@k"
	mems := make([]*memory, readers+1)
	for i := range mems {
		mems[i] = newMemory(t, 1, maxv)
	}
	s := h.open(t, mems...)
	leased := h.opts.Leases || h.leaser && (h.lease.Exists || h.lease.Get) && h.lease.TTL > 0
	// versionOf tells a value's version from its bytes, or -1.
	var mu sync.Mutex
	versions := map[uint64]int{}
	put := func(m *memory, v int) (stored bool, err error) {
		n := sizeOf(v)
		b := value(key, uint64(v), n)
		mu.Lock()
		versions[firstWord(b)] = v
		mu.Unlock()
		copy(m.bytes(0), b)
		res := make([]store.Result, 1)
		if err := s.Put(background, []string{key}, []rdma.Region{m.slot(0, n)}, res); err != nil {
			return false, fmt.Errorf("Put(%q, version %d) = %v, want nil", key, v, err)
		}
		if h.opts.Evicts && errors.Is(res[0].Err, store.ErrNoSpace) {
			return false, nil
		}
		if res[0].Err != nil || res[0].N != n {
			return false, fmt.Errorf("Put(%q, version %d of %d bytes) = {N: %d, Err: %v}, want {N: %d}", key, v, n, res[0].N, res[0].Err, n)
		}
		return true, nil
	}
	// get returns the version a get read (-1 for none), or an error for
	// bytes that are no version's.
	get := func(m *memory) (int, error) {
		res := make([]store.Result, 1)
		if err := s.Get(background, []string{key}, []rdma.Region{m.slot(0, maxv)}, res); err != nil {
			return 0, fmt.Errorf("Get(%q) = %v, want nil", key, err)
		}
		switch {
		case errors.Is(res[0].Err, store.ErrNotFound):
			return -1, nil
		case res[0].Err != nil:
			return 0, fmt.Errorf("Get(%q) = {Err: %v}, want the value or store.ErrNotFound", key, res[0].Err)
		}
		b := m.bytes(0)[:res[0].N]
		mu.Lock()
		v, ok := versions[firstWord(b)]
		mu.Unlock()
		if !ok || !bytes.Equal(b, value(key, uint64(v), sizeOf(v))) {
			return 0, fmt.Errorf("Get(%q) = %d bytes that are no value the key held (a torn value, or another key's)", key, res[0].N)
		}
		return v, nil
	}
	// remove removes the key; absent: the writer knows it absent.
	remove := func(absent bool) (bool, error) {
		switch err := s.Remove(background, key); {
		case err == nil:
			return true, nil
		case errors.Is(err, store.ErrNotFound) && (h.opts.Evicts || absent):
			return true, nil // evicted: gone as well
		case errors.Is(err, store.ErrHasLease) && leased:
			return false, nil
		default:
			return false, fmt.Errorf("Remove(%q) = %v, want nil", key, err)
		}
	}

	// Alone.
	w := mems[readers]
	for v := 1; v <= 20; v++ {
		stored, err := put(w, v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := get(w)
		switch {
		case err != nil:
			t.Fatal(err)
		case stored && got != v && !(h.opts.Evicts && got == -1):
			t.Fatalf("Get(%q) after Remove and Put of version %d returned version %d: a put after a remove stores the new value", key, v, got)
		}
		removed, err := remove(!stored)
		if err != nil {
			t.Fatal(err)
		}
		if !removed {
			t.Skipf("Remove(%q) left the key (lease or eviction): nothing more to check alone", key)
		}
		if got, err := get(w); err != nil {
			t.Fatal(err)
		} else if got != -1 {
			t.Fatalf("Get(%q) after Remove returned version %d, want store.ErrNotFound", key, got)
		}
	}

	// With readers.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := range readers {
		wg.Go(func() {
			for !stop.Load() {
				if _, err := get(mems[r]); err != nil {
					t.Errorf("reader %d: %v", r, err)
					stop.Store(true)
				}
			}
		})
	}
	current := -1 // the version the key holds, as far as the writer knows
	for v := 21; v < 21+iterations()/4 && !stop.Load(); v++ {
		removed, err := remove(current == -1)
		if err != nil {
			t.Error(err)
			break
		}
		if removed || current == -1 {
			current = -1
			stored, err := put(w, v)
			if err != nil {
				t.Error(err)
				break
			}
			if stored {
				current = v
			}
		}
	}
	stop.Store(true)
	wait(t, "the readers of the Reput subtest", &wg)
	if t.Failed() {
		return
	}
	got, err := get(w)
	switch {
	case err != nil:
		t.Fatal(err)
	case got != current && !(h.opts.Evicts && got == -1):
		t.Fatalf("Get(%q) after the writer's last Put (version %d) returned version %d", key, current, got)
	}
}
