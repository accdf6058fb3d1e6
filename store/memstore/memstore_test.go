package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

var ctx = context.Background()

func hostMemory(t *testing.T, n int) *rdma.HostMemory {
	t.Helper()
	mem, err := rdma.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mem.Free(); err != nil {
			t.Error(err)
		}
	})
	return mem
}

func sub(t *testing.T, r rdma.Region, off, n int) rdma.Region {
	t.Helper()
	s, err := r.Sub(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStats checks every counter after a known sequence of calls.
func TestStats(t *testing.T) {
	s := open(t, memstore.Config{Capacity: 64 << 10, HighWatermark: 1, EvictRatio: 0.01})
	defer s.Close()
	mem := hostMemory(t, 128<<10)
	r := mem.Region()
	res := make([]store.Result, 3)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Put(ctx, []string{"a", "b", "a"}, []rdma.Region{sub(t, r, 0, 1000), sub(t, r, 0, 3000), sub(t, r, 0, 5)}, res))
	must(s.Put(ctx, []string{"big"}, []rdma.Region{sub(t, r, 0, 65<<10-1)}, res[:1])) // larger than the capacity
	must(s.Get(ctx, []string{"b", "a", "zz"}, []rdma.Region{sub(t, r, 0, 4096), sub(t, r, 0, 4096), sub(t, r, 0, 4096)}, res))
	must(s.Exists(ctx, []string{"a", "zz"}, res[:2]))
	must(s.Put(ctx, []string{"c"}, []rdma.Region{sub(t, r, 0, 62<<10)}, res[:1])) // evicts b, read before a
	want := store.Stats{
		Keys: 2, Bytes: 62<<10 + 1000, Capacity: 64 << 10,
		Hits: 2, Misses: 1, Exists: 2,
		Puts: 3, Duplicates: 1, RejectedPuts: 1, Evictions: 1,
		BytesIn: 1000 + 3000 + 62<<10, BytesOut: 4000,
	}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Errorf("Stats() (-want +got):\n%s", diff)
	}
	must(s.Exists(ctx, []string{"a", "b"}, res[:2]))
	if res[0].Err != nil || !errors.Is(res[1].Err, store.ErrNotFound) {
		t.Errorf("after the eviction: Exists(a, b) = %v, %v; want a present (read last), b evicted", res[0].Err, res[1].Err)
	}
}

func TestPerKeyErrors(t *testing.T) {
	s := open(t, memstore.Config{Capacity: 64 << 10})
	defer s.Close()
	mem := hostMemory(t, 8192)
	r := mem.Region()
	res := make([]store.Result, 1)
	for _, tc := range []struct {
		name string
		src  rdma.Region
		key  string
		want error
		text string
	}{
		{"device region", rdma.Region{Addr: 0x10000, Len: 100, Loc: rdma.Device(0)}, "k", store.ErrInvalidRegion, "in cuda:0: memstore copies host memory only"},
		{"zero length", rdma.Region{Addr: r.Addr, Len: 0, Loc: rdma.Host}, "k", store.ErrInvalidRegion, "length must be positive"},
		{"address zero", rdma.Region{Len: 10, Loc: rdma.Host}, "k", store.ErrInvalidRegion, "address must not be zero"},
		{"wraps", rdma.Region{Addr: ^uintptr(0) - 4, Len: 10, Loc: rdma.Host}, "k", store.ErrInvalidRegion, "wraps around"},
		{"larger than capacity", rdma.Region{Addr: r.Addr, Len: 65 << 10, Loc: rdma.Host}, "k", store.ErrNoSpace, "value of 66560 bytes is larger than the capacity, 65536 bytes"},
		{"bad key", sub(t, r, 0, 10), "a b", store.ErrInvalidKey, `key "a b" has byte 0x20 at 1`},
	} {
		if err := s.Put(ctx, []string{tc.key}, []rdma.Region{tc.src}, res); err != nil {
			t.Fatalf("%s: Put = %v", tc.name, err)
		}
		if !errors.Is(res[0].Err, tc.want) || !strings.Contains(res[0].Err.Error(), tc.text) {
			t.Errorf("%s: Put(%q) error = %v, want %v containing %q", tc.name, tc.key, res[0].Err, tc.want, tc.text)
		}
		if tc.want == store.ErrInvalidRegion && !strings.Contains(res[0].Err.Error(), `put "k": source region`) {
			t.Errorf("%s: Put error %q does not name the key and the region", tc.name, res[0].Err)
		}
	}
	if err := s.Put(ctx, []string{"k"}, []rdma.Region{sub(t, r, 0, 100)}, res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	if err := s.Get(ctx, []string{"k"}, []rdma.Region{sub(t, r, 4096, 99)}, res); err != nil {
		t.Fatal(err)
	}
	if want := `store: buffer too small: get "k": value of 100 bytes, destination of 99`; res[0].Err == nil || res[0].Err.Error() != want {
		t.Errorf("Get into a short region: %v, want %q", res[0].Err, want)
	}
}

// TestRequireRegistered checks that with RequireRegistered only memory
// inside one registered region is accepted, and that without it any host
// memory is.
func TestRequireRegistered(t *testing.T) {
	mem := hostMemory(t, 4*4096)
	r := mem.Region()
	a, b := sub(t, r, 0, 2*4096), sub(t, r, 2*4096, 2*4096)
	for _, require := range []bool{false, true} {
		s := open(t, memstore.Config{Capacity: 64 << 10, RequireRegistered: require})
		put := func(src rdma.Region) error {
			res := make([]store.Result, 1)
			if err := s.Put(ctx, []string{fmt.Sprintf("k@%x@%d", src.Addr, src.Len)}, []rdma.Region{src}, res); err != nil {
				t.Fatal(err)
			}
			return res[0].Err
		}
		if err := put(sub(t, r, 100, 100)); (err != nil) != require {
			t.Errorf("RequireRegistered %v: Put from unregistered memory = %v", require, err)
		}
		if err := s.Register(a); err != nil {
			t.Fatal(err)
		}
		if err := s.Register(b); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			src rdma.Region
			ok  bool
		}{
			{a, true},
			{sub(t, r, 4096, 4096), true},
			{sub(t, r, 2*4096, 100), true},
			{sub(t, r, 4096, 2*4096), false}, // straddles a and b
		} {
			err := put(tc.src)
			if ok := err == nil; ok != (tc.ok || !require) {
				t.Errorf("RequireRegistered %v: Put from %+v = %v", require, tc.src, err)
			}
			if err != nil && (!errors.Is(err, store.ErrInvalidRegion) || !strings.Contains(err.Error(), "not inside a registered region")) {
				t.Errorf("RequireRegistered %v: Put from %+v = %v, want store.ErrInvalidRegion naming registration", require, tc.src, err)
			}
		}
		err := s.Register(sub(t, r, 4096, 4096))
		if !errors.Is(err, store.ErrInvalidRegion) || !strings.Contains(err.Error(), "overlaps registered region of 8192 bytes") {
			t.Errorf("Register of an overlapping region = %v, want store.ErrInvalidRegion naming the other region", err)
		}
		if err := s.Unregister(a); err != nil {
			t.Fatal(err)
		}
		if err := put(sub(t, r, 0, 100)); (err != nil) != require {
			t.Errorf("RequireRegistered %v: Put from unregistered memory = %v", require, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func Example() {
	s, err := memstore.New(memstore.Config{Capacity: 64 << 20})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	// Values move between the store and host memory outside the Go heap.
	kv, err := rdma.AllocHost(2 * 4096)
	if err != nil {
		panic(err)
	}
	defer kv.Free()
	blk0, _ := kv.Region().Sub(0, 4096)
	blk1, _ := kv.Region().Sub(4096, 4096)
	copy(blk0.Bytes(), "block zero")

	ctx := context.Background()
	res := make([]store.Result, 1)
	if err := s.Put(ctx, []string{"tenant@ns@0001"}, []rdma.Region{blk0}, res); err != nil {
		panic(err)
	}
	if err := s.Get(ctx, []string{"tenant@ns@0001"}, []rdma.Region{blk1}, res); err != nil {
		panic(err)
	}
	fmt.Println(res[0].N, res[0].Err, string(blk1.Bytes()[:10]))

	res2 := make([]store.Result, 2)
	if err := s.Exists(ctx, []string{"tenant@ns@0001", "tenant@ns@0002"}, res2); err != nil {
		panic(err)
	}
	fmt.Println(res2[0].Err, res2[1].Err)
	// Output:
	// 4096 <nil> block zero
	// <nil> store: not found
}
