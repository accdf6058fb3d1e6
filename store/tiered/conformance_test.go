package tiered_test

import (
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// counters are the Stats counters the Store keeps exactly: all but
// Evictions, which sums the tiers'.
const counters = storetest.AllCounters &^ storetest.CounterEvictions

// shape is a Store in tiers to test: a RAM tier over a disk tier.
type shape struct {
	ram, disk int64 // capacities
	cfg       tiered.Config
	filter    bool
	faulty    int // 0: none; 1: faults in the RAM tier; 2: in the disk tier
}

func newRAMDisk(t testing.TB, sh shape) (*tiered.Store, storetest.Faulty) {
	t.Helper()
	seg := max(64<<10, sh.disk/8) // a 64 MiB tier takes values of 8 MiB
	disk := openDisk(t, diskstore.Config{Dir: t.TempDir(), Capacity: sh.disk, SegmentSize: seg})
	mem, err := memstore.New(memstore.Config{Capacity: sh.ram, Shards: 4})
	if err != nil {
		disk.Close()
		t.Fatal(err)
	}
	var top, low store.Store = mem, disk
	var faulty storetest.Faulty
	faults := storetest.FaultOptions{
		Seed: 3, Ops: storetest.OpExists | storetest.OpGet | storetest.OpPut,
		CallRate: 0.02, KeyRate: 0.1, VanishRate: 0.05,
	}
	switch sh.faulty {
	case 1:
		faulty = storetest.NewFaulty(mem, faults)
		top = faulty
	case 2:
		faulty = storetest.NewFaulty(disk, faults)
		low = faulty
	}
	cfg := sh.cfg
	cfg.Tiers = []tiered.Tier{
		{Store: top, Medium: tiered.MediumCPU},
		{Store: low, Medium: tiered.MediumDisk, Filter: sh.filter},
	}
	s, err := tiered.New(cfg)
	if err != nil {
		mem.Close()
		disk.Close()
		t.Fatal(err)
	}
	return s, faulty
}

// TestConformance runs the store conformance harness over a RAM tier over
// a disk tier: large enough never to evict, with write-through and with
// write-back, with the admission filter, small enough that both tiers
// evict, and with faults injected into either tier (which the other,
// holding every key, masks).
func TestConformance(t *testing.T) {
	large := storetest.Options{Capacity: 1 << 20, Counters: counters}
	// Values of several MiB, beyond the RAM tier, in the checks that size
	// their values by the capacity (half the disk tier's).
	huge := storetest.Options{Capacity: 32 << 20, Counters: counters}
	for _, tc := range []struct {
		name  string
		shape shape
		opts  storetest.Options
	}{
		{"WriteThrough", shape{ram: 8 << 20, disk: 64 << 20}, huge},
		{"WriteBack", shape{ram: 8 << 20, disk: 64 << 20, cfg: tiered.Config{WriteBack: true}}, large},
		{"NoPromote", shape{ram: 8 << 20, disk: 64 << 20, cfg: tiered.Config{NoPromote: true}}, large},
		{"Filter", shape{ram: 8 << 20, disk: 64 << 20, filter: true}, large},
		{"Evicting", shape{ram: 64 << 10, disk: 1 << 20}, storetest.Options{Evicts: true, Capacity: 1 << 20, Counters: counters &^ storetest.CounterRejectedPuts}},
		{"SmallRAM", shape{ram: 64 << 10, disk: 64 << 20}, huge},
		{"FaultyRAM", shape{ram: 8 << 20, disk: 64 << 20, faulty: 1}, storetest.Options{Capacity: 1 << 20}},
		{"FaultyDisk", shape{ram: 8 << 20, disk: 64 << 20, faulty: 2}, storetest.Options{Capacity: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var faults storetest.FaultCounts
			storetest.Run(t, func(t testing.TB) store.Store {
				s, f := newRAMDisk(t, tc.shape)
				if f != nil {
					t.Cleanup(func() {
						mu.Lock()
						defer mu.Unlock()
						c := f.Faults()
						faults.Calls += c.Calls
						faults.Keys += c.Keys
						faults.Vanished += c.Vanished
					})
				}
				return s
			}, tc.opts)
			if tc.shape.faulty != 0 && (faults.Calls == 0 || faults.Keys == 0) {
				t.Errorf("faults injected: %+v; want whole calls and keys failed", faults)
			}
			t.Logf("faults injected: %+v", faults)
		})
	}
}
