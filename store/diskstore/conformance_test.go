package diskstore_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

func open(t testing.TB, cfg diskstore.Config) *diskstore.Store {
	t.Helper()
	s, err := diskstore.Open(cfg)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("Open: %v", err)
	}
	if err != nil {
		t.Fatalf("Open(%+v) = %v", cfg, err)
	}
	return s
}

// TestConformance runs the store conformance harness over a store large
// enough never to evict, and over a small one that evicts whole segments
// all the time.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  diskstore.Config
		opts storetest.Options
	}{
		// Large declares half its capacity (whole oldest segments go
		// first), so that values of several MiB are in flight in the
		// checks that size their values by it.
		{"Large", diskstore.Config{Capacity: 64 << 20, SegmentSize: 8 << 20}, storetest.Options{Capacity: 32 << 20, Stats: true, Counters: storetest.AllCounters}},
		{"Evicting", diskstore.Config{Capacity: 256 << 10, SegmentSize: 64 << 10}, storetest.Options{Evicts: true, Capacity: 256 << 10, Stats: true, Counters: storetest.AllCounters}},
		{"Buffered", diskstore.Config{Capacity: 64 << 20, SegmentSize: 4 << 20, Buffered: true}, storetest.Options{Capacity: 1 << 20, MaxValueSize: 64 << 10, Stats: true, Counters: storetest.AllCounters}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var stores []*diskstore.Store
			storetest.Run(t, func(t testing.TB) store.Store {
				cfg := tc.cfg
				cfg.Dir = t.TempDir()
				s := open(t, cfg)
				mu.Lock()
				stores = append(stores, s)
				mu.Unlock()
				return s
			}, tc.opts)
			var st store.Stats
			for _, s := range stores {
				st.Evictions += s.Stats().Evictions
			}
			if evicted := st.Evictions > 0; evicted != tc.opts.Evicts {
				t.Errorf("the harness ran with Evicts %v, but the stores evicted %d keys", tc.opts.Evicts, st.Evictions)
			}
		})
	}
}
