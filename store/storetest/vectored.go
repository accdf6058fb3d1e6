package storetest

import (
	"bytes"
	"errors"
	"math/rand/v2"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// vgap is the room left between the regions of one key, filled with the
// canary: a store that writes past a region, or reads regions as if they
// were contiguous, is caught there.
const vgap = 8

// scatter cuts n bytes into len(parts) regions of slot i of m, of the sizes
// parts (which sum to n), laid out in reverse order with vgap bytes
// between them: region 0 is last in memory, so that regions are never
// contiguous in the order of the list.
func scatter(m *memory, i int, parts []int) []rdma.Region {
	out := make([]rdma.Region, len(parts))
	off := 0
	for j := len(parts) - 1; j >= 0; j-- {
		out[j] = m.subslot(i, off, parts[j])
		off += parts[j] + vgap
	}
	return out
}

// cut returns len sizes of at least one byte that sum to n (n >= k).
func cut(rng *rand.Rand, n, k int) []int {
	k = max(1, min(k, n))
	parts := make([]int, k)
	left := n - k
	for j := range k - 1 {
		extra := rng.IntN(left + 1)
		parts[j] = 1 + extra
		left -= extra
	}
	parts[k-1] = 1 + left
	rng.Shuffle(k, func(a, b int) { parts[a], parts[b] = parts[b], parts[a] })
	return parts
}

// gather returns the bytes of regions rs, in order.
func gather(rs []rdma.Region) []byte {
	var b []byte
	for _, r := range rs {
		b = append(b, r.Bytes()...)
	}
	return b
}

// fill writes v across rs, in order (rs hold exactly len(v) bytes).
func fill(rs []rdma.Region, v []byte) {
	for _, r := range rs {
		v = v[copy(r.Bytes(), v):]
	}
}

// vectored checks store.Vectored when the store implements it: values
// put with PutV across regions of random sizes read back whole by Get, and
// values put with Put by GetV across regions; GetV into too little room is
// store.ErrBufferTooSmall with nothing written, into more room fills a
// prefix and leaves the rest; empty region lists are store.ErrInvalidRegion
// for their key alone; repeated keys behave as in Put and Get; slices of
// different lengths fail the call.
func (h *harness) vectored(t tester) {
	maxv := min(h.opts.MaxValueSize, 1024)
	const slots = 8
	mem := newMemory(t, slots, 2*maxv+16*vgap)
	plain := newMemory(t, slots, maxv)
	s := h.open(t, mem, plain)
	v, ok := s.(store.Vectored)
	if !ok {
		t.Skipf("storetest: %T does not implement store.Vectored", s)
	}
	rng := rand.New(rand.NewPCG(6, 0))
	res := make([]store.Result, slots)
	evicted := func(op, key string, err error) bool {
		if h.opts.Evicts && errors.Is(err, store.ErrNotFound) {
			t.Logf("%s(%q): %v: evicted, not checked", op, key, err)
			return true
		}
		return false
	}

	// PutV across 1 to 5 regions each, read back by Get and by GetV.
	keys := []string{"vec@0", "vec@1", "vec@2", "vec@3"}
	vals := make([][]byte, len(keys))
	src := make([][]rdma.Region, len(keys))
	for i, k := range keys {
		vals[i] = value(k, 1, 1+rng.IntN(maxv))
		src[i] = scatter(mem, i, cut(rng, len(vals[i]), 1+i))
		fill(src[i], vals[i])
	}
	if err := v.PutV(background, keys, src, res[:len(keys)]); err != nil {
		t.Fatalf("PutV(%q) = %v, want nil", keys, err)
	}
	for i, r := range res[:len(keys)] {
		if r.Err != nil || r.N != len(vals[i]) {
			t.Fatalf("PutV(%q): key %q from %d regions = {N: %d, Err: %v}, want {N: %d} (the regions' total length)", keys, keys[i], len(src[i]), r.N, r.Err, len(vals[i]))
		}
		if !bytes.Equal(gather(src[i]), vals[i]) {
			t.Fatalf("PutV(%q): wrote into the source regions of %q", keys, keys[i])
		}
	}
	dst := make([]rdma.Region, len(keys))
	for i := range keys {
		canary(plain.bytes(i))
		dst[i] = plain.slot(i, maxv)
	}
	if err := s.Get(background, keys, dst, res[:len(keys)]); err != nil {
		t.Fatalf("Get(%q) = %v, want nil", keys, err)
	}
	for i, r := range res[:len(keys)] {
		if evicted("Get", keys[i], r.Err) {
			continue
		}
		if r.Err != nil || r.N != len(vals[i]) || !bytes.Equal(plain.bytes(i)[:r.N], vals[i]) {
			t.Errorf("Get(%q) of a value PutV gathered from %d regions = {N: %d, Err: %v}, want its %d bytes in order%s",
				keys[i], len(src[i]), r.N, r.Err, len(vals[i]), firstDiff(vals[i], plain.bytes(i)[:max(0, r.N)]))
		}
	}
	h.getV(t, v, mem, keys, vals, rng, res, evicted)

	// Put, then GetV; and PutV of present keys, with other values: kept.
	pkeys := []string{"vec@p0", "vec@p1"}
	pvals := make([][]byte, len(pkeys))
	for i, k := range pkeys {
		pvals[i] = value(k, 1, maxv-i)
		copy(plain.bytes(i), pvals[i])
		dst[i] = plain.slot(i, len(pvals[i]))
	}
	if err := s.Put(background, pkeys, dst[:2], res[:2]); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Put(%q) = %v, %+v; want nil", pkeys, err, res[:2])
	}
	h.getV(t, v, mem, pkeys, pvals, rng, res, evicted)
	for i, k := range pkeys {
		other := value(k, 2, len(pvals[i])/2+1)
		src[i] = scatter(mem, i, cut(rng, len(other), 3))
		fill(src[i], other)
	}
	if err := v.PutV(background, pkeys, src[:2], res[:2]); err != nil {
		t.Fatalf("PutV(%q) of present keys = %v, want nil", pkeys, err)
	}
	for i, r := range res[:2] {
		if r.Err != nil || r.N != len(gather(src[i])) {
			t.Errorf("PutV(%q): present key %q = {N: %d, Err: %v}, want success with N %d", pkeys, pkeys[i], r.N, r.Err, len(gather(src[i])))
		}
	}
	h.getV(t, v, mem, pkeys, pvals, rng, res, evicted) // still the first values

	// Too little room across three regions: nothing written. More room:
	// a prefix filled, the rest unchanged.
	k, want := keys[3], vals[3]
	if len(want) >= 4 {
		for _, room := range []int{len(want) - 1, len(want) + 1 + rng.IntN(maxv)} {
			canary(mem.bytes(0))
			rs := scatter(mem, 0, cut(rng, room, 3))
			if err := v.GetV(background, []string{k}, [][]rdma.Region{rs}, res[:1]); err != nil {
				t.Fatalf("GetV(%q) = %v, want nil", k, err)
			}
			r := res[0]
			switch {
			case evicted("GetV", k, r.Err):
			case room < len(want):
				if !errors.Is(r.Err, store.ErrBufferTooSmall) {
					t.Errorf("GetV(%q) of %d bytes into regions of %d bytes together = {N: %d, Err: %v}, want store.ErrBufferTooSmall", k, len(want), room, r.N, r.Err)
				}
				if j := canaryBroken(mem.bytes(0), 0); j >= 0 {
					t.Errorf("GetV(%q) into too little room: %v, but wrote byte %d of the regions' slot (nothing may be written)", k, r.Err, j)
				}
			case r.Err != nil || r.N != len(want):
				t.Errorf("GetV(%q) of %d bytes into regions of %d bytes = {N: %d, Err: %v}, want {N: %d}", k, len(want), room, r.N, r.Err, len(want))
			default:
				got := gather(rs)
				if !bytes.Equal(got[:len(want)], want) {
					t.Errorf("GetV(%q) into regions of %d bytes: the regions do not hold the value, in order, from the first%s", k, room, firstDiff(want, got[:len(want)]))
				}
				if !onlyPrefixWritten(mem, rs, len(want)) {
					t.Errorf("GetV(%q) of %d bytes into regions of %d bytes wrote past the value, or between the regions (the rest must stay unchanged)", k, len(want), room)
				}
			}
		}
	}

	// Empty region lists fail alone; a list with a bad region stores nothing.
	canary(plain.bytes(7))
	ekeys := []string{"vec@empty", keys[0], "vec@nil"}
	lists := [][]rdma.Region{{}, {plain.slot(7, maxv)}, nil}
	if err := v.GetV(background, ekeys, lists, res[:3]); err != nil {
		t.Fatalf("GetV with empty region lists = %v, want per-key results", err)
	}
	for _, i := range []int{0, 2} {
		if !errors.Is(res[i].Err, store.ErrInvalidRegion) {
			t.Errorf("GetV(%q) into an empty region list = {N: %d, Err: %v}, want store.ErrInvalidRegion", ekeys[i], res[i].N, res[i].Err)
		}
	}
	if r := res[1]; !evicted("GetV", keys[0], r.Err) && (r.Err != nil || !bytes.Equal(plain.bytes(7)[:max(0, r.N)], vals[0])) {
		t.Errorf("GetV(%q) beside empty region lists = {N: %d, Err: %v}, want its value", keys[0], r.N, r.Err)
	}
	bad := []rdma.Region{plain.slot(6, 16), {Addr: plain.slot(5, 1).Addr, Len: 0, Loc: rdma.Host}}
	fillValue(plain.bytes(6), "vec@bad", 1)
	if err := v.PutV(background, []string{"vec@empty", "vec@bad", "vec@ok"}, [][]rdma.Region{nil, bad, {plain.slot(6, 16)}}, res[:3]); err != nil {
		t.Fatalf("PutV with an empty list and a zero-length region = %v, want per-key results", err)
	}
	for i, k := range []string{"vec@empty", "vec@bad"} {
		if !errors.Is(res[i].Err, store.ErrInvalidRegion) {
			t.Errorf("PutV(%q) from %s = {N: %d, Err: %v}, want store.ErrInvalidRegion", k, []string{"an empty region list", "a list with a zero-length region"}[i], res[i].N, res[i].Err)
		}
	}
	if res[2].Err != nil && !(h.opts.Evicts && errors.Is(res[2].Err, store.ErrNoSpace)) {
		t.Errorf("PutV(%q) beside bad region lists = %v, want nil", "vec@ok", res[2].Err)
	}
	if err := s.Exists(background, []string{"vec@empty", "vec@bad"}, res[:2]); err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"vec@empty", "vec@bad"} {
		if !errors.Is(res[i].Err, store.ErrNotFound) {
			t.Errorf("after PutV(%q) failed: Exists = {N: %d, Err: %v}, want store.ErrNotFound (nothing stored)", k, res[i].N, res[i].Err)
		}
	}

	// Repeated keys: the first occurrence's bytes, every occurrence filled.
	rk := "vec@rep"
	rvals := [][]byte{value(rk, 1, maxv/2), value(rk, 2, maxv)}
	for i := range rvals {
		src[i] = scatter(mem, i, cut(rng, len(rvals[i]), 2+i))
		fill(src[i], rvals[i])
	}
	if err := v.PutV(background, []string{rk, rk}, src[:2], res[:2]); err != nil {
		t.Fatalf("PutV(%q twice) = %v, want nil", rk, err)
	}
	for i, r := range res[:2] {
		if r.Err != nil || r.N != len(rvals[i]) {
			t.Errorf("PutV(%q twice): occurrence %d = {N: %d, Err: %v}, want {N: %d}", rk, i, r.N, r.Err, len(rvals[i]))
		}
	}
	h.getV(t, v, mem, []string{rk, rk}, [][]byte{rvals[0], rvals[0]}, rng, res, evicted)

	// Slices of different lengths fail the whole call.
	if err := v.PutV(background, []string{"vec@m0", "vec@m1"}, src[:1], res[:2]); err == nil {
		t.Errorf("PutV with 2 keys and 1 region list = nil, want a whole-call error")
	}
	if err := v.GetV(background, keys[:2], [][]rdma.Region{src[0]}, res[:2]); err == nil {
		t.Errorf("GetV with 2 keys and 1 region list = nil, want a whole-call error")
	}
	if err := v.GetV(background, keys[:1], src[:1], res[:2]); err == nil {
		t.Errorf("GetV with 1 key and 2 result slots = nil, want a whole-call error")
	}
}

// getV reads keys, holding vals, with one GetV into regions of random
// sizes and exact total room, one slot of mem per key, and checks every
// byte of each slot: the value in order, and the canary elsewhere.
func (h *harness) getV(t tester, v store.Vectored, mem *memory, keys []string, vals [][]byte, rng *rand.Rand, res []store.Result, evicted func(op, key string, err error) bool) {
	t.Helper()
	dst := make([][]rdma.Region, len(keys))
	for i := range keys {
		canary(mem.bytes(i))
		dst[i] = scatter(mem, i, cut(rng, len(vals[i]), 1+rng.IntN(5)))
	}
	if err := v.GetV(background, keys, dst, res[:len(keys)]); err != nil {
		t.Fatalf("GetV(%q) = %v, want nil", keys, err)
	}
	for i, r := range res[:len(keys)] {
		if evicted("GetV", keys[i], r.Err) {
			continue
		}
		if r.Err != nil || r.N != len(vals[i]) {
			t.Errorf("GetV(%q): key %q into %d regions = {N: %d, Err: %v}, want {N: %d}", keys, keys[i], len(dst[i]), r.N, r.Err, len(vals[i]))
			continue
		}
		if got := gather(dst[i]); !bytes.Equal(got, vals[i]) {
			t.Errorf("GetV(%q): key %q into %d regions: the regions do not hold its value, in order%s", keys, keys[i], len(dst[i]), firstDiff(vals[i], got))
		}
		if !onlyPrefixWritten(mem, dst[i], len(vals[i])) {
			t.Errorf("GetV(%q): key %q: wrote outside its regions (between or past them)", keys, keys[i])
		}
	}
}

// onlyPrefixWritten reports whether, in the slot that regions rs cut
// (canaried before the call), only the first n bytes of rs, in order, may
// differ from the canary.
func onlyPrefixWritten(mem *memory, rs []rdma.Region, n int) bool {
	base := mem.region().Addr
	written := map[int]bool{}
	for _, r := range rs {
		start := int(r.Addr - base)
		for j := 0; j < r.Len && n > 0; j++ {
			written[start+j] = true
			n--
		}
	}
	slot := int(rs[0].Addr-base) / mem.slotSize
	b := mem.mem.Bytes()
	for off := slot * mem.slotSize; off < (slot+1)*mem.slotSize; off++ {
		if !written[off] && b[off] != canaryByte(off-slot*mem.slotSize) {
			return false
		}
	}
	return true
}
