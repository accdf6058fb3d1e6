package prom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// TestTierStats puts a key into a store of two RAM tiers, reads it after
// the top tier lost it, and checks the per-tier hits and moves.
func TestTierStats(t *testing.T) {
	var tiers []tiered.Tier
	var mems []*memstore.Store
	for _, medium := range []string{"CPU", "STORAGE"} {
		m, err := memstore.New(memstore.Config{Capacity: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		mems = append(mems, m)
		tiers = append(tiers, tiered.Tier{Store: m, Medium: medium})
	}
	s, err := tiered.New(tiered.Config{Tiers: tiers})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mem, err := rdma.AllocHost(4096)
	if err != nil {
		t.Skip(err)
	}
	defer mem.Free()
	res := []store.Result{{}}
	keys, regs := []string{"k"}, []rdma.Region{mem.Region()}
	if err := s.Put(t.Context(), keys, regs, res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	if err := mems[0].Remove(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // from STORAGE, promoted; then from CPU
		if err := s.Get(t.Context(), keys, regs, res); err != nil || res[0].Err != nil {
			t.Fatal(err, res[0].Err)
		}
	}
	const want = `
# HELP kvconnect_store_tier_get_keys_total Keys a Get of the store asked this tier for, by result: hit (served here), miss (not served here; a lower tier was asked).
# TYPE kvconnect_store_tier_get_keys_total counter
kvconnect_store_tier_get_keys_total{medium="CPU",result="hit"} 1
kvconnect_store_tier_get_keys_total{medium="CPU",result="miss"} 1
kvconnect_store_tier_get_keys_total{medium="STORAGE",result="hit"} 1
kvconnect_store_tier_get_keys_total{medium="STORAGE",result="miss"} 0
# HELP kvconnect_store_tier_moved_keys_total Keys copied into this tier, by direction: up (promoted from a tier below), down (written through, written back or copied down from a tier above).
# TYPE kvconnect_store_tier_moved_keys_total counter
kvconnect_store_tier_moved_keys_total{direction="down",medium="CPU"} 0
kvconnect_store_tier_moved_keys_total{direction="down",medium="STORAGE"} 1
kvconnect_store_tier_moved_keys_total{direction="up",medium="CPU"} 1
kvconnect_store_tier_moved_keys_total{direction="up",medium="STORAGE"} 0
`
	if err := testutil.CollectAndCompare(prom.NewTierStats(s, prom.Options{}), strings.NewReader(want),
		"kvconnect_store_tier_get_keys_total", "kvconnect_store_tier_moved_keys_total"); err != nil {
		t.Error(err)
	}
}
