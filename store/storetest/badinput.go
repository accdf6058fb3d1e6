package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// fixture is a store holding a few known keys, and the memory to call it.
type fixture struct {
	t    tester
	s    store.Store
	mem  *memory
	keys []string
	vals [][]byte
}

const fixtureSlots = 8

func (h *harness) fixture(t tester) *fixture {
	t.Helper()
	maxv := min(h.opts.MaxValueSize, 512)
	f := &fixture{t: t, mem: newMemory(t, fixtureSlots, maxv)}
	f.s = h.open(t, f.mem)
	f.keys = []string{"bad@k0", "bad@k1", "bad@k2"}
	src := make([]rdma.Region, len(f.keys))
	for i, k := range f.keys {
		f.vals = append(f.vals, value(k, 1, maxv-i))
		copy(f.mem.bytes(i), f.vals[i])
		src[i] = f.mem.slot(i, len(f.vals[i]))
	}
	res := make([]store.Result, len(f.keys))
	if err := f.s.Put(background, f.keys, src, res); err != nil {
		t.Fatalf("Put(%q) = %v, want nil", f.keys, err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("Put(%q): key %q: %v, want nil", f.keys, f.keys[i], r.Err)
		}
	}
	return f
}

// unchanged checks that the fixture's keys hold their values and that the
// keys in absent are absent.
func (f *fixture) unchanged(after string, absent ...string) {
	f.t.Helper()
	for i, k := range f.keys {
		canary(f.mem.bytes(0))
		res := make([]store.Result, 1)
		err := f.s.Get(background, []string{k}, []rdma.Region{f.mem.slot(0, f.mem.slotSize)}, res)
		if err != nil || res[0].Err != nil || !bytes.Equal(f.mem.bytes(0)[:res[0].N], f.vals[i]) {
			f.t.Errorf("after %s: Get(%q) = %v, %v, %d bytes; want its %d-byte value unchanged", after, k, err, res[0].Err, res[0].N, len(f.vals[i]))
		}
	}
	for _, k := range absent {
		if store.ValidateKey(k) != nil {
			continue
		}
		res := make([]store.Result, 1)
		err := f.s.Exists(background, []string{k}, res)
		if err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
			f.t.Errorf("after %s: Exists(%q) = %v, %v; want the key absent", after, k, err, res[0].Err)
		}
	}
}

// badKeys are invalid keys, each with why.
var badKeys = []struct{ key, why string }{
	{"", "empty"},
	{"bad@has space", "a space"},
	{"bad@tab\there", "a tab"},
	{"bad@nul\x00", "a NUL byte"},
	{"bad@del\x7f", "a DEL byte"},
	{"bad@é", "non-ASCII"},
	{"bad@" + strings.Repeat("x", store.MaxKeyLen-3), "longer than store.MaxKeyLen"},
}

func (h *harness) badInput(t tester) {
	t.run("Keys", h.badKeys)
	t.run("Regions", h.badRegions)
	t.run("ShortDestination", h.shortDestination)
	t.run("Mismatch", h.mismatch)
	t.run("Remove", h.badRemove)
}

// badKeys sends batches that mix valid and invalid keys: the invalid ones
// get store.ErrInvalidKey, the valid ones are served, nothing else changes.
func (h *harness) badKeys(t tester) {
	f := h.fixture(t)
	keys := []string{"bad@new0"}
	for _, b := range badKeys {
		keys = append(keys, b.key)
	}
	keys = append(keys, "bad@new1")
	n := len(keys)
	mem := newMemory(t, n, 64)
	if err := f.s.Register(mem.region()); err != nil {
		t.Fatalf("Register(%v) = %v, want nil", mem.region(), err)
	}
	src := make([]rdma.Region, n)
	for i, k := range keys {
		src[i] = mem.slot(i, 64)
		fillValue(mem.bytes(i), k, 1)
	}
	why := func(i int) string { return badKeys[i-1].why }
	res := make([]store.Result, n)
	if err := f.s.Put(background, keys, src, res); err != nil {
		t.Fatalf("Put of valid and invalid keys = %v, want per-key results and a nil error", err)
	}
	for i, r := range res {
		switch {
		case i == 0 || i == n-1:
			if r.Err != nil {
				t.Errorf("Put: valid key %q beside invalid ones: %v, want nil", keys[i], r.Err)
			}
		case !errors.Is(r.Err, store.ErrInvalidKey):
			t.Errorf("Put: key %.40q (%s): %v, want store.ErrInvalidKey", keys[i], why(i), r.Err)
		}
	}
	f.unchanged("Put of invalid keys", keys[1:n-1]...)

	if err := f.s.Exists(background, keys, res); err != nil {
		t.Fatalf("Exists of valid and invalid keys = %v, want per-key results and a nil error", err)
	}
	for i, r := range res {
		switch {
		case i == 0 || i == n-1:
			if r.Err != nil || r.N != 64 {
				t.Errorf("Exists: valid key %q beside invalid ones: %v, N = %d; want present with 64 bytes", keys[i], r.Err, r.N)
			}
		case !errors.Is(r.Err, store.ErrInvalidKey):
			t.Errorf("Exists: key %.40q (%s): %v, want store.ErrInvalidKey", keys[i], why(i), r.Err)
		}
	}

	for i := range keys {
		canary(mem.bytes(i))
	}
	if err := f.s.Get(background, keys, src, res); err != nil {
		t.Fatalf("Get of valid and invalid keys = %v, want per-key results and a nil error", err)
	}
	for i, r := range res {
		switch {
		case i == 0 || i == n-1:
			if r.Err != nil || !bytes.Equal(mem.bytes(i)[:r.N], value(keys[i], 1, 64)) {
				t.Errorf("Get: valid key %q beside invalid ones: %v, %d bytes; want its 64-byte value", keys[i], r.Err, r.N)
			}
		case !errors.Is(r.Err, store.ErrInvalidKey):
			t.Errorf("Get: key %.40q (%s): %v, want store.ErrInvalidKey", keys[i], why(i), r.Err)
		case canaryBroken(mem.bytes(i), 0) >= 0:
			t.Errorf("Get: key %.40q (%s): %v, but wrote the destination", keys[i], why(i), r.Err)
		}
	}
	if err := f.s.Unregister(mem.region()); err != nil {
		t.Errorf("Unregister(%v) = %v, want nil", mem.region(), err)
	}
	f.unchanged("Get of invalid keys")
}

// badRegions puts from and gets into regions that name no memory.
func (h *harness) badRegions(t tester) {
	f := h.fixture(t)
	good := f.mem.slot(fixtureSlots-1, 16)
	bad := []struct {
		r   rdma.Region
		why string
	}{
		{rdma.Region{}, "the zero Region"},
		{rdma.Region{Addr: good.Addr, Len: 0, Loc: rdma.Host}, "zero length"},
		{rdma.Region{Addr: good.Addr, Len: -8, Loc: rdma.Host}, "negative length"},
		{rdma.Region{Addr: 0, Len: 16, Loc: rdma.Host}, "address zero"},
	}
	if !h.opts.DeviceMemory {
		// Host memory that the region says is on a device: a store that
		// ignores Loc reads and writes it as host memory.
		bad = append(bad, struct {
			r   rdma.Region
			why string
		}{rdma.Region{Addr: good.Addr, Len: good.Len, Loc: rdma.Device(0)}, "a device region (the store declares no Options.DeviceMemory)"})
	}
	for _, b := range bad {
		key := "bad@region"
		res := make([]store.Result, 2)
		keys := []string{key, "bad@region-ok"}
		fillValue(f.mem.bytes(fixtureSlots-1), keys[1], 1)
		if err := f.s.Put(background, keys, []rdma.Region{b.r, good}, res); err != nil {
			t.Fatalf("Put from %s = %v, want per-key results and a nil error", b.why, err)
		}
		if !errors.Is(res[0].Err, store.ErrInvalidRegion) {
			t.Errorf("Put(%q) from %s (%+v): %v, want store.ErrInvalidRegion", key, b.why, b.r, res[0].Err)
		}
		if res[1].Err != nil {
			t.Errorf("Put(%q) beside a bad region: %v, want nil", keys[1], res[1].Err)
		}
		f.unchanged("Put from "+b.why, key)
		if err := f.s.Remove(background, keys[1]); err != nil {
			t.Errorf("Remove(%q) = %v, want nil", keys[1], err)
		}

		k0 := f.keys[0]
		canary(f.mem.bytes(fixtureSlots - 1))
		if err := f.s.Get(background, []string{k0}, []rdma.Region{b.r}, res[:1]); err != nil {
			t.Fatalf("Get into %s = %v, want per-key results and a nil error", b.why, err)
		}
		if !errors.Is(res[0].Err, store.ErrInvalidRegion) {
			t.Errorf("Get(%q) into %s (%+v): %v, want store.ErrInvalidRegion", k0, b.why, b.r, res[0].Err)
		}
		if j := canaryBroken(f.mem.bytes(fixtureSlots-1), 0); j >= 0 {
			t.Errorf("Get(%q) into %s (%+v): wrote byte %d of the host memory at its address", k0, b.why, b.r, j)
		}
		f.unchanged("Get into " + b.why)
	}
}

// shortDestination gets values into regions one byte too short.
func (h *harness) shortDestination(t tester) {
	f := h.fixture(t)
	for i, k := range f.keys {
		canary(f.mem.bytes(fixtureSlots - 1))
		dst := f.mem.slot(fixtureSlots-1, len(f.vals[i])-1)
		res := make([]store.Result, 1)
		if err := f.s.Get(background, []string{k}, []rdma.Region{dst}, res); err != nil {
			t.Fatalf("Get into a short region = %v, want per-key results and a nil error", err)
		}
		if !errors.Is(res[0].Err, store.ErrBufferTooSmall) {
			t.Errorf("Get(%q) of %d bytes into %d: %v, N = %d; want store.ErrBufferTooSmall", k, len(f.vals[i]), dst.Len, res[0].Err, res[0].N)
		}
		if j := canaryBroken(f.mem.bytes(fixtureSlots-1), 0); j >= 0 {
			t.Errorf("Get(%q) of %d bytes into %d: wrote byte %d of the destination", k, len(f.vals[i]), dst.Len, j)
		}
	}
	f.unchanged("Get into short regions")
}

// mismatch sends batches whose slices disagree in length: the whole call
// must fail, and do nothing.
func (h *harness) mismatch(t tester) {
	f := h.fixture(t)
	k0, k1 := "bad@mismatch0", "bad@mismatch1"
	two := []string{k0, k1}
	slot := func(i int) rdma.Region {
		fillValue(f.mem.bytes(i), "bad@mismatch", uint64(i))
		return f.mem.slot(i, 32)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Put with 2 keys, 1 region", func() error {
			return f.s.Put(background, two, []rdma.Region{slot(3)}, make([]store.Result, 2))
		}},
		{"Put with 2 keys, 3 regions", func() error {
			return f.s.Put(background, two, []rdma.Region{slot(3), slot(4), slot(5)}, make([]store.Result, 2))
		}},
		{"Put with 2 keys, 1 result", func() error {
			return f.s.Put(background, two, []rdma.Region{slot(3), slot(4)}, make([]store.Result, 1))
		}},
		{"Get with 2 keys, 1 region", func() error {
			return f.s.Get(background, f.keys[:2], []rdma.Region{f.mem.slot(3, f.mem.slotSize)}, make([]store.Result, 2))
		}},
		{"Get with 2 keys, 3 results", func() error {
			return f.s.Get(background, f.keys[:2], []rdma.Region{f.mem.slot(3, f.mem.slotSize), f.mem.slot(4, f.mem.slotSize)}, make([]store.Result, 3))
		}},
		{"Exists with 2 keys, 1 result", func() error {
			return f.s.Exists(background, two, make([]store.Result, 1))
		}},
		{"Exists with 0 keys, 1 result", func() error {
			return f.s.Exists(background, nil, make([]store.Result, 1))
		}},
	} {
		for i := 3; i < fixtureSlots; i++ {
			canary(f.mem.bytes(i))
		}
		if err := tc.call(); err == nil {
			t.Errorf("%s = nil error, want a whole-call error", tc.name)
		}
		if strings.HasPrefix(tc.name, "Get") {
			for i := 3; i < fixtureSlots; i++ {
				if canaryBroken(f.mem.bytes(i), 0) >= 0 {
					t.Errorf("%s wrote into a destination", tc.name)
				}
			}
		}
		f.unchanged(tc.name, two...)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Put of no keys", func() error { return f.s.Put(background, nil, nil, nil) }},
		{"Get of no keys", func() error { return f.s.Get(background, nil, nil, nil) }},
		{"Exists of no keys", func() error { return f.s.Exists(background, nil, nil) }},
	} {
		if err := tc.call(); err != nil {
			t.Errorf("%s = %v, want nil", tc.name, err)
		}
	}
}

// badRemove removes invalid keys and prefixes: errors, and nothing removed.
func (h *harness) badRemove(t tester) {
	f := h.fixture(t)
	for _, b := range badKeys {
		if err := f.s.Remove(background, b.key); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Remove(%.40q) (%s) = %v, want store.ErrInvalidKey", b.key, b.why, err)
		}
	}
	if n, err := f.s.RemovePrefix(background, ""); err == nil || n != 0 {
		t.Errorf("RemovePrefix(\"\") = %d, %v; want 0 and an error (an empty prefix is RemoveAll's job)", n, err)
	}
	f.unchanged("Remove of invalid keys")
}

// register checks the bookkeeping of registered regions.
func (h *harness) register(t tester) {
	mem := newMemory(t, 5, 4096)
	s := h.open(t)
	whole := mem.region()
	a, err := whole.Sub(4096, 2*4096) // slots 1 and 2
	if err != nil {
		t.Fatal(err)
	}
	b := mem.slot(3, 4096)
	if err := s.Register(a); err != nil {
		t.Fatalf("Register(%v) = %v, want nil", a, err)
	}
	for _, tc := range []struct {
		r   rdma.Region
		why string
	}{
		{a, "the same region again"},
		{whole, "a region around a registered one"},
		{mem.slot(1, 100), "a region inside a registered one"},
		{rdma.Region{Addr: a.Addr + 4096, Len: 2 * 4096, Loc: rdma.Host}, "a region straddling a registered one's end"},
		{rdma.Region{Addr: a.Addr - 4096, Len: 2 * 4096, Loc: rdma.Host}, "a region that starts before a registered one and ends inside it"},
		{rdma.Region{Addr: a.Addr - 1, Len: 2, Loc: rdma.Host}, "a region whose last byte is a registered one's first"},
		{rdma.Region{}, "the zero Region"},
		{rdma.Region{Addr: b.Addr, Len: 0, Loc: rdma.Host}, "an empty region"},
	} {
		if err := s.Register(tc.r); err == nil {
			t.Errorf("Register(%v) of %s = nil, want an error", tc.r, tc.why)
			if err := s.Unregister(tc.r); err != nil {
				t.Errorf("Unregister(%v) = %v", tc.r, err)
			}
		}
	}
	if !h.opts.DeviceMemory {
		dev := rdma.Region{Addr: b.Addr, Len: b.Len, Loc: rdma.Device(0)}
		if err := s.Register(dev); err == nil {
			t.Errorf("Register(%v) of a device region = nil, want an error (the store declares no Options.DeviceMemory)", dev)
			if err := s.Unregister(dev); err != nil {
				t.Errorf("Unregister(%v) = %v", dev, err)
			}
		}
	}
	if err := s.Register(b); err != nil {
		t.Errorf("Register(%v), beside a registered region = %v, want nil", b, err)
	}
	if err := s.Unregister(b); err != nil {
		t.Errorf("Unregister(%v) = %v, want nil", b, err)
	}
	if err := s.Unregister(b); err == nil {
		t.Errorf("second Unregister(%v) = nil, want an error", b)
	}
	if err := s.Unregister(mem.slot(4, 4096)); err == nil {
		t.Errorf("Unregister(%v) of a region never registered = nil, want an error", mem.slot(4, 4096))
	}
	if err := s.Unregister(a); err != nil {
		t.Errorf("Unregister(%v) = %v, want nil", a, err)
	}
	if err := s.Register(whole); err != nil {
		t.Errorf("Register(%v) after its parts were unregistered = %v, want nil", whole, err)
	}
	if err := s.Unregister(whole); err != nil {
		t.Errorf("Unregister(%v) = %v, want nil", whole, err)
	}
}

// close checks calls after Close.
func (h *harness) close(t tester) {
	f := h.fixture(t)
	if err := f.s.Close(); err != nil {
		t.Fatalf("Close() = %v, want nil", err)
	}
	res := make([]store.Result, 1)
	src := f.mem.slot(0, 16)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Put", f.s.Put(background, f.keys[:1], []rdma.Region{src}, res)},
		{"Get", f.s.Get(background, f.keys[:1], []rdma.Region{src}, res)},
		{"Exists", f.s.Exists(background, f.keys[:1], res)},
		{"Remove", f.s.Remove(background, f.keys[0])},
		{"RemovePrefix", second(f.s.RemovePrefix(background, "bad@"))},
		{"RemoveAll", second(f.s.RemoveAll(background))},
		{"Register", f.s.Register(f.mem.slot(1, 64))},
	} {
		if !errors.Is(tc.err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want store.ErrClosed", tc.name, tc.err)
		}
	}
	if err := f.s.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
}

func second(_ int, err error) error { return err }

// registration puts from and gets into regions that lie inside a
// registered region, outside it, across its start or its end, or around
// it. A store that declares Options.Registration must refuse all but the
// first with store.ErrInvalidRegion for their key alone, storing and
// writing nothing; any other store must accept them all, as valid host
// regions.
func (h *harness) registration(t tester) {
	const slot, n = 64, 32
	mem := newMemory(t, 8, slot)
	reg, err := mem.region().Sub(2*slot, 4*slot) // slots 2 to 5
	if err != nil {
		t.Fatal(err)
	}
	back := newMemory(t, 1, 2*slot+reg.Len) // registered: where values are read back
	s := h.open(t, back)
	if err := s.Register(reg); err != nil {
		t.Fatalf("Register(%v) = %v, want nil", reg, err)
	}
	t.Cleanup(func() {
		if err := s.Unregister(reg); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("Unregister(%v) = %v, want nil", reg, err)
		}
	})
	ok := back.slot(0, n) // registered, apart from the regions: the source of the key beside them
	cases := []struct {
		r   rdma.Region
		why string
	}{
		{rdma.Region{Addr: reg.Addr - n/2, Len: n, Loc: rdma.Host}, "a region that starts before the registered one and ends inside it"},
		{rdma.Region{Addr: reg.End() - n/2, Len: n, Loc: rdma.Host}, "a region that starts inside the registered one and ends after it"},
		{mem.slot(7, n), "a region outside the registered one"},
		{rdma.Region{Addr: reg.Addr - 8, Len: reg.Len + 16, Loc: rdma.Host}, "a region around the registered one"},
	}
	res := make([]store.Result, 2)
	for i, c := range cases {
		if c.r.Len > h.opts.MaxValueSize {
			continue
		}
		key := fmt.Sprintf("reg@%d", i)
		keys := []string{key, fmt.Sprintf("reg@ok%d", i)}
		full := c.r.Bytes()
		fillValue(full, key, 1)
		want := bytes.Clone(full)
		fillValue(ok.Bytes(), keys[1], 1)
		if err := s.Put(background, keys, []rdma.Region{c.r, ok}, res); err != nil {
			t.Fatalf("Put from %s = %v, want per-key results and a nil error", c.why, err)
		}
		if res[1].Err != nil {
			t.Errorf("Put(%q) from a registered region beside %s: %v, want nil", keys[1], c.why, res[1].Err)
		}
		putErr := res[0].Err
		switch {
		case h.opts.Registration && !errors.Is(putErr, store.ErrInvalidRegion):
			t.Errorf("Put(%q) from %s: %v, want store.ErrInvalidRegion (the store declares Options.Registration)", key, c.why, putErr)
		case !h.opts.Registration && putErr != nil && !(h.opts.Evicts && errors.Is(putErr, store.ErrNoSpace)):
			t.Errorf("Put(%q) from %s: %v, want nil: a store that declares no Options.Registration accepts any valid host region", key, c.why, putErr)
		}

		// The key put from the region is absent, or holds its bytes.
		canary(back.bytes(0))
		if err := s.Get(background, keys[:1], []rdma.Region{back.slot(0, back.slotSize)}, res[:1]); err != nil {
			t.Fatalf("Get(%q) = %v, want nil", key, err)
		}
		switch r := res[0]; {
		case errors.Is(r.Err, store.ErrNotFound):
			if putErr == nil && !h.opts.Evicts {
				t.Errorf("Put(%q) from %s reported success, but the key is absent", key, c.why)
			}
		case r.Err != nil:
			t.Errorf("Get(%q) = %v, want its value or store.ErrNotFound", key, r.Err)
		case putErr != nil:
			t.Errorf("Put(%q) from %s failed (%v), but the key is present: nothing may be stored for it", key, c.why, putErr)
		case r.N != len(want) || !bytes.Equal(back.bytes(0)[:r.N], want):
			t.Errorf("Get(%q) after a put from %s returned %d bytes that are not the region's %d", key, c.why, r.N, len(want))
		}

		// Get the key beside into the region.
		canary(full)
		if err := s.Get(background, keys[1:], []rdma.Region{c.r}, res[:1]); err != nil {
			t.Fatalf("Get into %s = %v, want per-key results and a nil error", c.why, err)
		}
		switch r := res[0]; {
		case h.opts.Registration && !errors.Is(r.Err, store.ErrInvalidRegion):
			t.Errorf("Get(%q) into %s: {N: %d, Err: %v}, want store.ErrInvalidRegion (the store declares Options.Registration)", keys[1], c.why, r.N, r.Err)
		case h.opts.Registration && canaryBroken(full, 0) >= 0:
			t.Errorf("Get(%q) into %s: %v, but wrote byte %d of the region", keys[1], c.why, r.Err, canaryBroken(full, 0))
		case h.opts.Registration:
		case h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case r.Err != nil || r.N != n || !bytes.Equal(full[:n], value(keys[1], 1, n)):
			t.Errorf("Get(%q) into %s = {N: %d, Err: %v}, want its %d-byte value: a store that declares no Options.Registration accepts any valid host region", keys[1], c.why, r.N, r.Err, n)
		}
	}
}
