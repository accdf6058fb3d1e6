package storetest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// A Faulty store makes every key that Exists reports present vanish before
// the Get that follows, as an eviction between the two would.
func ExampleNewFaulty() {
	inner, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		panic(err)
	}
	s := storetest.NewFaulty(inner, storetest.FaultOptions{Seed: 1, VanishRate: 1})
	defer s.Close()

	mem, err := rdma.AllocHost(4096)
	if err != nil {
		panic(err)
	}
	defer mem.Free()

	ctx := context.Background()
	keys := []string{"tenant@ns@0001"}
	res := make([]store.Result, 1)
	if err := s.Put(ctx, keys, []rdma.Region{mem.Region()}, res); err != nil {
		panic(err)
	}
	if err := s.Exists(ctx, keys, res); err != nil {
		panic(err)
	}
	fmt.Println("exists:", res[0].Err)
	if err := s.Get(ctx, keys, []rdma.Region{mem.Region()}, res); err != nil {
		panic(err)
	}
	fmt.Println("get:", res[0].Err, errors.Is(res[0].Err, store.ErrNotFound))
	fmt.Printf("faults: %+v\n", s.Faults())
	// Output:
	// exists: <nil>
	// get: store: not found true
	// faults: {Calls:0 Keys:0 Vanished:1}
}

// ExampleRun is how a third party certifies its store: a test in its own
// package hands Run a constructor of fresh, empty stores and says what the
// store does: here it evicts, as a cache, within 1 MiB (small, so that
// the harness sees it evict), and keeps its hit and miss counts exactly.
func ExampleRun() {
	// In mystore_test.go:
	//
	//	func TestConformance(t *testing.T) {
	//		storetest.Run(t, func(t testing.TB) store.Store {
	//			s, err := mystore.Open(mystore.Config{Capacity: 1 << 20})
	//			if err != nil {
	//				t.Fatal(err)
	//			}
	//			return s // Run closes it
	//		}, storetest.Options{Evicts: true, Capacity: 1 << 20, Counters: storetest.CounterHits | storetest.CounterMisses})
	//	}
	var _ = storetest.Run
}
