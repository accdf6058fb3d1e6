//go:build linux

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// The fake library behaves as Mooncake's batch_get_into does with a key
// named twice in one call: only the last destination is written, and both
// occurrences report the full size. The binding's tests of repeated keys
// can fail only because of this.
func TestFakeFillsOnlyLastOfRepeatedKey(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	const size = 256
	m := registered(t, s, 3*size)
	r := slots(t, m, 3, size)
	fill(r[0].Bytes(), "twice")
	res := make([]store.Result, 1)
	if err := s.Put(context.Background(), []string{"twice"}, r[:1], res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	clear(r[1].Bytes())
	clear(r[2].Bytes())
	raw := newRawBatch(t, []string{"twice", "twice"}, r[1:3])
	if rc := h.batchGetInto(s.handle, raw.keys, raw.bufs, raw.sizes, 2, raw.results); rc != 0 {
		t.Fatalf("raw batch_get_into = %d", rc)
	}
	l := newLayout(2, 0)
	got := unsafeInt64s(raw.mem.Bytes()[l.res : l.res+16])
	if got[0] != size || got[1] != size {
		t.Errorf("raw batch_get_into of a key named twice: results %v, want [%d %d]", got, size, size)
	}
	if !bytes.Equal(r[1].Bytes(), make([]byte, size)) || !bytes.Equal(r[2].Bytes(), r[0].Bytes()) {
		t.Errorf("raw batch_get_into of a key named twice: first destination written %v, last %v; want false, true",
			!bytes.Equal(r[1].Bytes(), make([]byte, size)), bytes.Equal(r[2].Bytes(), r[0].Bytes()))
	}
}

// Get fills every occurrence of a repeated key, each judged on its own
// destination, in one native call, whatever the order of the sizes.
func TestGetRepeatedKeys(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	const size = 1000
	src := registered(t, s, 2*size)
	sr := slots(t, src, 2, size)
	fill(sr[0].Bytes(), "rep/a")
	fill(sr[1].Bytes(), "rep/b")
	res := make([]store.Result, 6)
	if err := s.Put(ctx, []string{"rep/a", "rep/b"}, sr, res[:2]); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err, res[:2])
	}
	const slot = 2 * size
	mem := registered(t, s, 6*slot)
	region := func(i, n int) rdma.Region {
		r, err := mem.Region().Sub(i*slot, n)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		keys  []string
		lens  []int
		wantN []int // -1: store.ErrBufferTooSmall, -2: store.ErrNotFound
	}{
		{"exact first", []string{"rep/a", "rep/b", "rep/a", "rep/a"}, []int{size, size, slot, size - 1}, []int{size, size, size, -1}},
		{"longest last", []string{"rep/a", "rep/a", "rep/a"}, []int{size - 1, size, slot}, []int{-1, size, size}},
		{"all too small", []string{"rep/b", "rep/b"}, []int{size - 1, 10}, []int{-1, -1}},
		{"absent", []string{"rep/x", "rep/a", "rep/x"}, []int{size, size, size}, []int{-2, size, -2}},
		{"six times", []string{"rep/b", "rep/b", "rep/b", "rep/b", "rep/b", "rep/b"}, []int{size, slot, size, size + 1, size, size}, []int{size, size, size, size, size, size}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]rdma.Region, len(tc.keys))
			for i, n := range tc.lens {
				dst[i] = region(i, n)
			}
			canary := func(int) []byte { return bytes.Repeat([]byte{0xa5}, slot) }
			for i := range dst {
				copy(region(i, slot).Bytes(), canary(i))
			}
			before := h.calls(s.handle)
			if err := s.Get(ctx, tc.keys, dst, res[:len(tc.keys)]); err != nil {
				t.Fatal(err)
			}
			if got := h.calls(s.handle) - before; got != 1 {
				t.Errorf("Get(%q) made %d native calls, want 1", tc.keys, got)
			}
			for i, want := range tc.wantN {
				r, b := res[i], region(i, slot).Bytes()
				switch want {
				case -1, -2:
					sentinel := store.ErrBufferTooSmall
					if want == -2 {
						sentinel = store.ErrNotFound
					}
					if !errors.Is(r.Err, sentinel) || r.N != 0 {
						t.Errorf("Get(%q): occurrence %d into %d bytes = %+v, want %v", tc.keys, i, tc.lens[i], r, sentinel)
					}
					if !bytes.Equal(b, canary(i)) {
						t.Errorf("Get(%q): occurrence %d failed but its destination was written", tc.keys, i)
					}
				default:
					val := sr[0].Bytes()
					if tc.keys[i] == "rep/b" {
						val = sr[1].Bytes()
					}
					if r != (store.Result{N: want}) {
						t.Errorf("Get(%q): occurrence %d = %+v, want {N: %d}", tc.keys, i, r, want)
					}
					if !bytes.Equal(b[:want], val) || !bytes.Equal(b[want:], canary(i)[want:]) {
						t.Errorf("Get(%q): occurrence %d into %d bytes: value copied %v, nothing past it %v",
							tc.keys, i, tc.lens[i], bytes.Equal(b[:want], val), bytes.Equal(b[want:], canary(i)[want:]))
					}
				}
			}
		})
	}
}

// Occurrences of a repeated key in device memory cannot be copied in Go:
// each is read by a native call of its own, which names the key once.
// (The fake reaches the "device" memory, which is host memory here.)
func TestGetRepeatedKeysDeviceMemory(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, func(c *Config) { c.DeviceMemory = true })
	ctx := context.Background()
	const size = 512
	host := registered(t, s, size)
	fill(host.Bytes(), "dev/a")
	res := make([]store.Result, 4)
	if err := s.Put(ctx, []string{"dev/a"}, []rdma.Region{host.Region()}, res[:1]); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	mem := alloc(t, 4*size)
	dev := rdma.Region{Addr: mem.Region().Addr, Len: mem.Region().Len, Loc: rdma.Device(0)}
	if err := s.Register(dev); err != nil {
		t.Fatal(err)
	}
	devSlot := func(i int) rdma.Region {
		r, err := dev.Sub(i*size, size)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	keys := []string{"dev/a", "dev/b", "dev/a", "dev/a"}
	dst := []rdma.Region{devSlot(0), devSlot(1), devSlot(2), host.Region()}
	clear(mem.Bytes())
	before := h.calls(s.handle)
	if err := s.Get(ctx, keys, dst, res); err != nil {
		t.Fatal(err)
	}
	if got := h.calls(s.handle) - before; got != 3 {
		t.Errorf("Get of a key named 3 times in device memory made %d native calls, want 3 (once per occurrence)", got)
	}
	want := bytes.Clone(host.Bytes())
	for i, k := range keys {
		if k == "dev/b" {
			if !errors.Is(res[i].Err, store.ErrNotFound) {
				t.Errorf("res[%d] = %+v, want store.ErrNotFound", i, res[i])
			}
			continue
		}
		if res[i] != (store.Result{N: size}) {
			t.Errorf("res[%d] = %+v, want {N: %d}", i, res[i], size)
		}
		if i < 3 && !bytes.Equal(mem.Bytes()[i*size:(i+1)*size], want) {
			t.Errorf("occurrence %d in device memory was not filled", i)
		}
	}
}

// A batch of distinct keys pays for the search for repeats, never for a
// second call: checked over batch sizes around the table's growth.
func TestGetDistinctKeysOneCall(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	const size = 16
	for _, n := range []int{1, 2, 7, 8, 9, 31, 32, 33, 300} {
		m := registered(t, s, n*size)
		regs := slots(t, m, n, size)
		keys := keysN(fmt.Sprintf("distinct%d", n), n)
		res := make([]store.Result, n)
		if err := s.Put(ctx, keys, regs, res); err != nil {
			t.Fatal(err)
		}
		before := h.calls(s.handle)
		if err := s.Get(ctx, keys, regs, res); err != nil {
			t.Fatal(err)
		}
		if got := h.calls(s.handle) - before; got != 1 {
			t.Errorf("Get of %d distinct keys made %d native calls, want 1", n, got)
		}
		for i, r := range res {
			if r != (store.Result{N: size}) {
				t.Fatalf("Get of %d keys: res[%d] = %+v", n, i, r)
			}
		}
	}
}
