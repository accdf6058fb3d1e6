package memstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestNoAllocations checks that the steady-state calls allocate nothing on
// the Go heap: Get and Exists of present and absent keys, Put of keys
// already present, and GetV and PutV likewise.
func TestNoAllocations(t *testing.T) {
	const n, size = 64, 4096
	s := open(t, memstore.Config{Capacity: 4 << 20})
	defer s.Close()
	mem, err := rdma.AllocHost(n * size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	keys := make([]string, n)
	missing := make([]string, n)
	regions := make([]rdma.Region, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant@ns@%04d", i)
		missing[i] = fmt.Sprintf("tenant@ns@missing%04d", i)
		regions[i], _ = mem.Region().Sub(i*size, size)
	}
	res := make([]store.Result, n)
	ctx := context.Background()
	if err := s.Put(ctx, keys, regions, res); err != nil {
		t.Fatal(err)
	}
	vregions := make([][]rdma.Region, n) // each value in two regions
	for i := range vregions {
		a, _ := regions[i].Sub(0, size/4)
		b, _ := regions[i].Sub(size/4, size-size/4)
		vregions[i] = []rdma.Region{a, b}
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Get", func() error { return s.Get(ctx, keys, regions, res) }},
		{"GetMissing", func() error { return s.Get(ctx, missing, regions, res) }},
		{"Exists", func() error { return s.Exists(ctx, keys, res) }},
		{"ExistsMissing", func() error { return s.Exists(ctx, missing, res) }},
		{"PutExisting", func() error { return s.Put(ctx, keys, regions, res) }},
		{"GetV", func() error { return s.GetV(ctx, keys, vregions, res) }},
		{"PutVExisting", func() error { return s.PutV(ctx, keys, vregions, res) }},
	} {
		var callErr error
		allocs := testing.AllocsPerRun(20, func() {
			if err := tc.call(); err != nil {
				callErr = err
			}
		})
		if callErr != nil {
			t.Fatalf("%s: %v", tc.name, callErr)
		}
		if allocs != 0 {
			t.Errorf("%s of %d keys: %v allocations per call, want 0", tc.name, n, allocs)
		}
	}
}
