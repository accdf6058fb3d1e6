package prom_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// hotPath is a batch of present keys with their regions, over one store
// bare and wrapped.
type hotPath struct {
	bare     *memstore.Store
	wrapped  prom.Instrumented
	keys     []string
	missing  []string
	src, dst []rdma.Region
	vdst     [][]rdma.Region
	res      []store.Result
}

func newHotPath(t testing.TB, n, size int) *hotPath {
	h := &hotPath{
		bare:    newMemstore(t, memstore.Config{Capacity: int64(4*n*size) + 1<<20}),
		keys:    make([]string, n),
		missing: make([]string, n),
		src:     regions(t, n, size),
		dst:     regions(t, n, size),
		vdst:    make([][]rdma.Region, n),
		res:     make([]store.Result, n),
	}
	h.wrapped = prom.InstrumentStore(h.bare, prom.Options{})
	for i := range h.keys {
		h.keys[i] = fmt.Sprintf("tenant-a@%016x@r0@%064x", 0xfeedface, i)
		h.missing[i] = fmt.Sprintf("tenant-a@%016x@r0@%064x", 0xdeadbeef, i)
		h.vdst[i] = []rdma.Region{h.dst[i]}
	}
	if err := h.bare.Put(context.Background(), h.keys, h.src, h.res); err != nil {
		t.Fatal(err)
	}
	return h
}

// calls are the steady-state calls of a connector over a store: each
// takes the store to call.
func (h *hotPath) calls(ctx context.Context) []struct {
	name string
	call func(s store.Store) error
} {
	return []struct {
		name string
		call func(s store.Store) error
	}{
		{"Get", func(s store.Store) error { return s.Get(ctx, h.keys, h.dst, h.res) }},
		{"GetMissing", func(s store.Store) error { return s.Get(ctx, h.missing, h.dst, h.res) }},
		{"PutPresent", func(s store.Store) error { return s.Put(ctx, h.keys, h.src, h.res) }},
		{"Exists", func(s store.Store) error { return s.Exists(ctx, h.keys, h.res) }},
		{"ExistsMissing", func(s store.Store) error { return s.Exists(ctx, h.missing, h.res) }},
		{"GetV", func(s store.Store) error { return s.(store.Vectored).GetV(ctx, h.keys, h.vdst, h.res) }},
	}
}

// TestNoAllocations checks that the wrapper adds no allocation to the
// steady-state calls: allocs/op over memstore wrapped equal those of the
// bare memstore, which are zero.
func TestNoAllocations(t *testing.T) {
	h := newHotPath(t, 32, 4096)
	for _, tc := range h.calls(context.Background()) {
		t.Run(tc.name, func(t *testing.T) {
			var callErr error
			measure := func(s store.Store) float64 {
				return testing.AllocsPerRun(50, func() {
					if err := tc.call(s); err != nil {
						callErr = err
					}
				})
			}
			bare, wrapped := measure(h.bare), measure(h.wrapped)
			if callErr != nil {
				t.Fatal(callErr)
			}
			if wrapped != bare || wrapped != 0 {
				t.Errorf("%s: %v allocs/op wrapped, %v bare; want 0 and 0", tc.name, wrapped, bare)
			}
		})
	}
}
