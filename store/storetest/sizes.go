package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// valueSizes are the sizes of the values the Sizes subtest stores, one at
// a time: from a few bytes to past 4 MiB (a real KV block is 256 KiB to
// several MiB), each next to a power of two, where chunked copies and
// size classes break.
var valueSizes = []int{1, 2, 7, 8, 9, 4095, 4096, 4097, 65537, 256 << 10, 1<<20 + 1, 4<<20 + 3}

// batchKeys is the number of keys of the Sizes subtest's batch calls: more
// than 256, past the batch sizes that implementations split at.
const batchKeys = 300

// sizes stores values of every size in valueSizes up to Options.Capacity,
// each alone in a fresh store, and reads them back through Get into a
// destination of the value's size and into a larger one, through GetV
// across regions cut at odd offsets (when the store implements
// store.Vectored), and checks Exists; then it puts, probes, gets and
// removes batchKeys keys in single calls. The values are a keyed hash of
// their key and position, so no part of one repeats another.
func (h *harness) sizes(t tester) {
	largest := 0
	for _, n := range valueSizes {
		if int64(n) <= h.opts.Capacity {
			largest = n
		}
	}
	if largest < valueSizes[len(valueSizes)-1] {
		t.Logf("Options.Capacity %d bounds the values stored: the largest is %d bytes", h.opts.Capacity, largest)
	}
	t.run("Values", func(t tester) { h.values(t, largest) })
	t.run("Batch", h.batch)
}

func (h *harness) values(t tester, largest int) {
	const pad = 4096
	mem := newMemory(t, 2, largest+pad)
	src, dst := 0, 1
	stored := 0
	for _, n := range valueSizes {
		if n > largest {
			break
		}
		s := h.open(t, mem)
		key := fmt.Sprintf("size@%d", n)
		want := value(key, 1, n)
		copy(mem.bytes(src), want)
		res := make([]store.Result, 1)
		if err := s.Put(background, []string{key}, []rdma.Region{mem.slot(src, n)}, res); err != nil {
			t.Fatalf("Put(%q, %d bytes) = %v, want nil", key, n, err)
		}
		if errors.Is(res[0].Err, store.ErrNoSpace) && h.opts.Evicts {
			t.Logf("Put(%q, %d bytes): %v: the evicting store has no room for it", key, n, res[0].Err)
			continue
		}
		if res[0].Err != nil || res[0].N != n {
			t.Fatalf("Put(%q, %d bytes) = {N: %d, Err: %v}, want {N: %d}", key, n, res[0].N, res[0].Err, n)
		}
		if err := s.Exists(background, []string{key}, res); err != nil {
			t.Fatalf("Exists(%q) = %v, want nil", key, err)
		}
		if errors.Is(res[0].Err, store.ErrNotFound) && h.opts.Evicts {
			t.Logf("Exists(%q): evicted from an otherwise empty store", key)
			continue
		}
		if res[0].Err != nil || res[0].N != n && res[0].N != 0 {
			t.Errorf("Exists(%q) = {N: %d, Err: %v}, want {N: %d}: the value's size", key, res[0].N, res[0].Err, n)
		}
		// Into a destination of the value's size, and one larger.
		for _, room := range []int{n, n + pad} {
			canary(mem.bytes(dst))
			if err := s.Get(background, []string{key}, []rdma.Region{mem.slot(dst, room)}, res); err != nil {
				t.Fatalf("Get(%q) into %d bytes = %v, want nil", key, room, err)
			}
			if errors.Is(res[0].Err, store.ErrNotFound) && h.opts.Evicts {
				continue
			}
			if res[0].Err != nil || res[0].N != n {
				t.Fatalf("Get(%q) into %d bytes = {N: %d, Err: %v}, want {N: %d}", key, room, res[0].N, res[0].Err, n)
			}
			got := mem.bytes(dst)
			if i := diffAt(got[:n], want); i >= 0 {
				t.Fatalf("Get(%q) into %d bytes: byte %d of the %d-byte value = %#x, want %#x%s", key, room, i, n, got[i], want[i], misplaced(want, got[:n], i))
			}
			if i := canaryBroken(got, n); i >= 0 {
				t.Fatalf("Get(%q) into %d bytes: it wrote byte %d, past the %d-byte value", key, room, i, n)
			}
		}
		if n > 1 {
			canary(mem.bytes(dst))
			if err := s.Get(background, []string{key}, []rdma.Region{mem.slot(dst, n-1)}, res); err != nil {
				t.Fatalf("Get(%q) into %d bytes = %v, want nil", key, n-1, err)
			}
			if !errors.Is(res[0].Err, store.ErrBufferTooSmall) && !(h.opts.Evicts && errors.Is(res[0].Err, store.ErrNotFound)) {
				t.Errorf("Get(%q) of %d bytes into %d = {N: %d, Err: %v}, want store.ErrBufferTooSmall", key, n, n-1, res[0].N, res[0].Err)
			}
			if i := canaryBroken(mem.bytes(dst), 0); i >= 0 {
				t.Errorf("Get(%q) of %d bytes into %d wrote byte %d: a too-short destination is not written", key, n, n-1, i)
			}
		}
		if vs, ok := s.(store.Vectored); ok && n >= 3 {
			// Three regions cut at odd offsets, and room to spare.
			a := n/3 + 1
			b := a + max(1, n/7)
			regs := []rdma.Region{mem.subslot(dst, 0, a), mem.subslot(dst, a, b-a), mem.subslot(dst, b, n-b+pad)}
			canary(mem.bytes(dst))
			if err := vs.GetV(background, []string{key}, [][]rdma.Region{regs}, res); err != nil {
				t.Fatalf("GetV(%q) across regions of %d, %d and %d bytes = %v, want nil", key, a, b-a, n-b+pad, err)
			}
			if res[0].Err == nil {
				if res[0].N != n {
					t.Errorf("GetV(%q) = {N: %d}, want {N: %d}", key, res[0].N, n)
				} else if i := diffAt(mem.bytes(dst)[:n], want); i >= 0 {
					t.Errorf("GetV(%q) across regions of %d, %d and %d bytes: byte %d = %#x, want %#x%s", key, a, b-a, n-b+pad, i, mem.bytes(dst)[i], want[i], misplaced(want, mem.bytes(dst)[:n], i))
				}
			} else if !(h.opts.Evicts && errors.Is(res[0].Err, store.ErrNotFound)) {
				t.Errorf("GetV(%q) = {Err: %v}, want its value", key, res[0].Err)
			}
		}
		stored++
	}
	if stored == 0 {
		t.Errorf("no value of any size in %v up to %d bytes could be stored and read back alone in a store", valueSizes, largest)
	}
}

// batch puts, probes, gets and removes batchKeys keys of sizes from 1 to
// 2 KiB (smaller if Capacity is small), each in one call.
func (h *harness) batch(t tester) {
	maxv := int(min(int64(2048), max(h.opts.Capacity/2/batchKeys, 1)))
	mem := newMemory(t, 2*batchKeys, maxv)
	s := h.open(t, mem)
	keys := make([]string, batchKeys)
	src := make([]rdma.Region, batchKeys)
	dst := make([]rdma.Region, batchKeys)
	vals := make([][]byte, batchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("batch@%03d", i)
		n := 1 + (i*37)%maxv
		vals[i] = value(keys[i], 1, n)
		copy(mem.bytes(i), vals[i])
		src[i] = mem.slot(i, n)
		// Destinations in reverse order: a store that serves key i into
		// destination i only by position in memory is caught.
		dst[i] = mem.slot(2*batchKeys-1-i, maxv)
	}
	res := make([]store.Result, batchKeys)
	if err := s.Put(background, keys, src, res); err != nil {
		t.Fatalf("Put of %d keys = %v, want nil", batchKeys, err)
	}
	stored := make([]bool, batchKeys)
	for i, r := range res {
		switch {
		case r.Err == nil && r.N == src[i].Len:
			stored[i] = true
		case h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace):
		default:
			t.Fatalf("Put of %d keys: key %d (%q) = {N: %d, Err: %v}, want {N: %d}", batchKeys, i, keys[i], r.N, r.Err, src[i].Len)
		}
	}
	if err := s.Exists(background, keys, res); err != nil {
		t.Fatalf("Exists of %d keys = %v, want nil", batchKeys, err)
	}
	for i, r := range res {
		switch {
		case !stored[i]:
		case r.Err == nil && (r.N == src[i].Len || r.N == 0):
		case h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		default:
			t.Fatalf("Exists of %d keys: key %d (%q) = {N: %d, Err: %v}, want {N: %d}", batchKeys, i, keys[i], r.N, r.Err, src[i].Len)
		}
	}
	for i := range dst {
		canary(mem.bytes(2*batchKeys - 1 - i))
	}
	if err := s.Get(background, keys, dst, res); err != nil {
		t.Fatalf("Get of %d keys = %v, want nil", batchKeys, err)
	}
	found := 0
	for i, r := range res {
		if !stored[i] || h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound) {
			continue
		}
		if r.Err != nil || r.N != src[i].Len {
			t.Fatalf("Get of %d keys: key %d (%q) = {N: %d, Err: %v}, want {N: %d}", batchKeys, i, keys[i], r.N, r.Err, src[i].Len)
		}
		got := mem.bytes(2*batchKeys - 1 - i)
		if !bytes.Equal(got[:r.N], vals[i]) {
			t.Fatalf("Get of %d keys: key %d (%q) holds other bytes than its value", batchKeys, i, keys[i])
		}
		if j := canaryBroken(got, r.N); j >= 0 {
			t.Fatalf("Get of %d keys: key %d (%q): it wrote byte %d, past the %d-byte value", batchKeys, i, keys[i], j, r.N)
		}
		found++
	}
	if found == 0 {
		t.Fatalf("Get of %d keys found none of them", batchKeys)
	}
	n, err := s.RemovePrefix(background, "batch@")
	leased := h.opts.Leases || h.leaser && (h.lease.Exists || h.lease.Get) && h.lease.TTL > 0
	switch {
	case err != nil && !(leased && errors.Is(err, store.ErrHasLease)):
		t.Fatalf("RemovePrefix(%q) over %d keys = %d, %v, want nil", "batch@", batchKeys, n, err)
	case !h.opts.Evicts && !leased && n != batchKeys:
		t.Fatalf("RemovePrefix(%q) over %d keys = %d, want %d", "batch@", batchKeys, n, batchKeys)
	case n > batchKeys:
		t.Fatalf("RemovePrefix(%q) over %d keys = %d: more than there are", "batch@", batchKeys, n)
	}
}

// diffAt returns the first index where a and b differ, or -1; they have
// the same length.
func diffAt(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// misplaced says where the bytes from index i of got come from in want,
// if they are want's bytes from another offset.
func misplaced(want, got []byte, i int) string {
	probe := got[i:min(len(got), i+32)]
	if len(probe) < 8 {
		return ""
	}
	if j := bytes.Index(want, probe); j >= 0 {
		return fmt.Sprintf(": the bytes from there are the value's bytes from offset %d (%+d)", j, j-i)
	}
	if strings.Count(string(probe), string(probe[:1])) == len(probe) {
		return fmt.Sprintf(": the bytes from there are all %#x", probe[0])
	}
	return ""
}
