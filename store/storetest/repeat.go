package storetest

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// repeatedKeys names keys more than once in one batch. A put keeps the
// bytes of a key's first occurrence, and every occurrence succeeds with its
// own region's length; a get fills the destination of every occurrence,
// each judged on its own size; an absent key is absent for each.
func (h *harness) repeatedKeys(t tester) {
	maxv := min(h.opts.MaxValueSize, 512)
	mem := newMemory(t, 8, maxv+64)
	s := h.open(t, mem)
	a, b := "rep@a", "rep@b"

	// One put: a three times, each with another value and size, and b.
	keys := []string{a, b, a, a}
	sizes := []int{maxv / 2, maxv, maxv, maxv / 4}
	src := make([]rdma.Region, len(keys))
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		vals[i] = value(k, uint64(i+1), sizes[i])
		copy(mem.bytes(i), vals[i])
		src[i] = mem.slot(i, sizes[i])
	}
	res := make([]store.Result, 5)
	if err := s.Put(background, keys, src, res[:4]); err != nil {
		t.Fatalf("Put(%q) = %v, want nil", keys, err)
	}
	for i, r := range res[:4] {
		if r.Err != nil || r.N != sizes[i] {
			t.Fatalf("Put(%q): occurrence %d of %q = {N: %d, Err: %v}, want {N: %d} (every occurrence of a repeated key succeeds, with its own source's length, not the size of the value kept)",
				keys, i, keys[i], r.N, r.Err, sizes[i])
		}
	}
	got := func(key string) []byte {
		canary(mem.bytes(7))
		if err := s.Get(background, []string{key}, []rdma.Region{mem.slot(7, mem.slotSize)}, res[:1]); err != nil {
			t.Fatalf("Get(%q) = %v, want nil", key, err)
		}
		if errors.Is(res[0].Err, store.ErrNotFound) && h.opts.Evicts {
			t.Skipf("Get(%q): %v: evicted, nothing more to check", key, res[0].Err)
		}
		if res[0].Err != nil {
			t.Fatalf("Get(%q): %v, want its value", key, res[0].Err)
		}
		return bytes.Clone(mem.bytes(7)[:res[0].N])
	}
	if v := got(a); !bytes.Equal(v, vals[0]) {
		which := "none of its occurrences'"
		for i := range keys {
			if keys[i] == a && bytes.Equal(v, vals[i]) {
				which = fmt.Sprintf("those of occurrence %d", i)
			}
		}
		t.Fatalf("after Put(%q): key %q holds %d bytes, %s; want the %d bytes of its first occurrence (first writer wins within a batch too)",
			keys, a, len(v), which, len(vals[0]))
	}
	if v := got(b); !bytes.Equal(v, vals[1]) {
		t.Fatalf("after Put(%q): key %q does not hold its value", keys, b)
	}

	// A present key, named twice: both succeed, the value stays.
	for i := range 2 {
		fillValue(mem.bytes(i), b, uint64(10+i))
		src[i] = mem.slot(i, maxv-i)
	}
	if err := s.Put(background, []string{b, b}, src[:2], res[:2]); err != nil {
		t.Fatalf("Put(%q, %q) = %v, want nil", b, b, err)
	}
	for i, r := range res[:2] {
		if r.Err != nil || r.N != maxv-i {
			t.Fatalf("Put of present key %q twice: occurrence %d = {N: %d, Err: %v}, want {N: %d}, its own source's length (not %d, the size of the value the key keeps)",
				b, i, r.N, r.Err, maxv-i, len(vals[1]))
		}
	}
	if v := got(b); !bytes.Equal(v, vals[1]) {
		t.Fatalf("after a second Put of %q, named twice: the value changed", b)
	}

	// One get: a four times into destinations of every kind, and b.
	want := vals[0]
	keys = []string{a, b, a, a, a}
	lens := []int{len(want), mem.slotSize, mem.slotSize, len(want) - 1, len(want) + 1}
	dst := make([]rdma.Region, len(keys))
	for i := range keys {
		canary(mem.bytes(i))
		dst[i] = mem.slot(i, lens[i])
	}
	if err := s.Get(background, keys, dst, res); err != nil {
		t.Fatalf("Get(%q) = %v, want nil", keys, err)
	}
	for i, r := range res {
		k, v := keys[i], want
		if k == b {
			v = vals[1]
		}
		switch {
		case h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case len(v) > lens[i]:
			if !errors.Is(r.Err, store.ErrBufferTooSmall) {
				t.Errorf("Get(%q): occurrence %d of %q into %d bytes, shorter than its %d-byte value: {N: %d, Err: %v}, want store.ErrBufferTooSmall",
					keys, i, k, lens[i], len(v), r.N, r.Err)
			}
			if j := canaryBroken(mem.bytes(i), 0); j >= 0 {
				t.Errorf("Get(%q): occurrence %d of %q: %v, but wrote byte %d of its destination", keys, i, k, r.Err, j)
			}
		case r.Err != nil || r.N != len(v):
			t.Errorf("Get(%q): occurrence %d of %q into %d bytes = {N: %d, Err: %v}, want {N: %d}", keys, i, k, lens[i], r.N, r.Err, len(v))
		case !bytes.Equal(mem.bytes(i)[:r.N], v):
			t.Errorf("Get(%q): occurrence %d of %q reports %d bytes read, but its destination does not hold the value%s (a repeated key fills every occurrence's destination)",
				keys, i, k, r.N, firstDiff(v, mem.bytes(i)[:r.N]))
		case canaryBroken(mem.bytes(i), r.N) >= 0:
			t.Errorf("Get(%q): occurrence %d of %q: wrote byte %d of its destination, past the %d-byte value", keys, i, k, canaryBroken(mem.bytes(i), r.N), r.N)
		}
	}

	// An absent key, named twice.
	keys = []string{"rep@absent", a, "rep@absent"}
	for i := range keys {
		canary(mem.bytes(i))
		dst[i] = mem.slot(i, mem.slotSize)
	}
	if err := s.Get(background, keys, dst[:3], res[:3]); err != nil {
		t.Fatalf("Get(%q) = %v, want nil", keys, err)
	}
	for _, i := range []int{0, 2} {
		if !errors.Is(res[i].Err, store.ErrNotFound) || canaryBroken(mem.bytes(i), 0) >= 0 {
			t.Errorf("Get(%q): occurrence %d of an absent key = {N: %d, Err: %v}, destination written %v; want store.ErrNotFound and nothing written",
				keys, i, res[i].N, res[i].Err, canaryBroken(mem.bytes(i), 0) >= 0)
		}
	}
}
