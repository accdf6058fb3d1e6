package tiered_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// TestLayered: ExistsTier, GetTier and GetVTier say which tier found or
// served each key, -1 for a key none did, and a hit in a lower tier is
// served from the top once promoted.
func TestLayered(t *testing.T) {
	var tiers []tiered.Tier
	var mems []*memstore.Store
	for _, m := range []string{tiered.MediumCPU, tiered.MediumDisk} {
		mem, err := memstore.New(memstore.Config{Capacity: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		tiers, mems = append(tiers, tiered.Tier{Store: mem, Medium: m}), append(mems, mem)
	}
	s, err := tiered.New(tiered.Config{Tiers: tiers})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ly store.Layered = s
	if diff := cmp.Diff([]string{"CPU", "DISK"}, ly.Media()); diff != "" {
		t.Errorf("Media() (-want +got):\n%s", diff)
	}
	src := fill(host(t, 4096), 1)
	dst := host(t, 4096)
	for _, r := range []rdma.Region{src, dst} {
		if err := s.Register(r); err != nil {
			t.Fatal(err)
		}
	}
	putKeys(t, s, src, "both")
	putKeys(t, mems[1], src, "low")

	keys := []string{"low", "both", "none", "bad key"}
	res := make([]store.Result, len(keys))
	tier := make([]int, len(keys))
	if err := ly.ExistsTier(bg, keys, res, tier); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1, 0, -1, -1}, tier); diff != "" {
		t.Errorf("ExistsTier(%q) tiers (-want +got):\n%s", keys, diff)
	}
	// get reads keys into dst (each key split in two regions with vec)
	// and checks the tiers reported.
	get := func(name string, vec bool, want []int) {
		t.Helper()
		for i := range tier {
			tier[i] = 7
		}
		var err error
		if vec {
			a, _ := dst.Sub(0, 2048)
			b, _ := dst.Sub(2048, 2048)
			v := make([][]rdma.Region, len(keys))
			for i := range v {
				v[i] = []rdma.Region{a, b}
			}
			err = ly.GetVTier(bg, keys, v, res, tier)
		} else {
			d := make([]rdma.Region, len(keys))
			for i := range d {
				d[i] = dst
			}
			err = ly.GetTier(bg, keys, d, res, tier)
		}
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, tier); diff != "" {
			t.Errorf("%s(%q) tiers (-want +got):\n%s", name, keys, diff)
		}
	}
	get("GetVTier", true, []int{1, 0, -1, -1})
	// "low" was promoted by that Get: now the top tier serves it.
	get("GetTier after promotion", false, []int{0, 0, -1, -1})
	keys, res, tier = keys[:2], res[:2], tier[:2]
	get("GetTier of keys all in the top tier", false, []int{0, 0})

	if err := ly.ExistsTier(bg, keys, res, tier[:1]); err == nil || !strings.Contains(err.Error(), "2 keys but 1 tier slots") {
		t.Errorf("ExistsTier with 1 tier slot for %d keys = %v, want an error naming the tier slots", len(keys), err)
	}
	if err := ly.GetTier(bg, keys, []rdma.Region{dst, dst}, res, tier[:1]); err == nil || !strings.Contains(err.Error(), "2 keys but 1 tier slots") {
		t.Errorf("GetTier with 1 tier slot for %d keys = %v, want an error naming the tier slots", len(keys), err)
	}
}
