package memstore_test

import (
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

func open(t testing.TB, cfg memstore.Config) *memstore.Store {
	t.Helper()
	s, err := memstore.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return s
}

// TestConformance runs the store conformance harness in three shapes: a
// store large enough never to evict (so the harness checks that nothing
// vanishes), a small one that evicts all the time, and one that, like
// Mooncake, refuses unregistered memory.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  memstore.Config
		opts storetest.Options
	}{
		{"Large", memstore.Config{Capacity: 64 << 20, Shards: 8}, storetest.Options{Capacity: 64 << 20, Stats: true, Counters: storetest.AllCounters}},
		{"Evicting", memstore.Config{Capacity: 64 << 10, Shards: 4}, storetest.Options{Evicts: true, Capacity: 64 << 10, Stats: true, Counters: storetest.AllCounters}},
		{"RequireRegistered", memstore.Config{Capacity: 8 << 20, RequireRegistered: true}, storetest.Options{Capacity: 8 << 20, Stats: true, Registration: true, Counters: storetest.AllCounters}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the shapes share nothing: a run takes the longest, not the sum
			var mu sync.Mutex
			var stores []*memstore.Store
			storetest.Run(t, func(t testing.TB) store.Store {
				s := open(t, tc.cfg)
				mu.Lock()
				stores = append(stores, s)
				mu.Unlock()
				return s
			}, tc.opts)
			var st store.Stats
			for _, s := range stores {
				x := s.Stats()
				st.Evictions += x.Evictions
				st.Hits += x.Hits
				st.Puts += x.Puts
				st.Duplicates += x.Duplicates
			}
			t.Logf("%d stores: %+v", len(stores), st)
			if evicted := st.Evictions > 0; evicted != tc.opts.Evicts {
				t.Errorf("the harness ran with Evicts %v, but the stores evicted %d keys", tc.opts.Evicts, st.Evictions)
			}
		})
	}
}
