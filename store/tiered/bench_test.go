package tiered_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// BenchmarkRAMHit gets a batch of values that the RAM tier holds, through
// the Store in tiers (a memstore over a diskstore) and straight from a
// memstore of the same shape, alternately in one loop, and reports the
// Store's time over the memstore's (x-memstore: 1 is as fast).
func BenchmarkRAMHit(b *testing.B) {
	for _, size := range []int{4 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			const batch = 16
			s, _, _ := ramDisk(b, 64<<20, tiered.Config{}, false)
			direct, err := memstore.New(memstore.Config{Capacity: 64 << 20, Shards: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer direct.Close()
			mem, err := rdma.AllocHost(batch * size)
			if err != nil {
				b.Skip(err)
			}
			defer mem.Free()
			keys := make([]string, batch)
			regs := make([]rdma.Region, batch)
			res := make([]store.Result, batch)
			for i := range keys {
				keys[i] = fmt.Sprintf("tenant-a@%064x", i)
				if regs[i], err = mem.Region().Sub(i*size, size); err != nil {
					b.Fatal(err)
				}
			}
			for _, st := range []store.Store{s, direct} {
				if err := st.Put(bg, keys, regs, res); err != nil {
					b.Fatal(err)
				}
			}
			get := func(st store.Store) time.Duration {
				t0 := time.Now()
				if err := st.Get(bg, keys, regs, res); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				for i, r := range res {
					if r.Err != nil {
						b.Fatalf("Get(%q) = %v", keys[i], r.Err)
					}
				}
				return d
			}
			// getTier is get through GetTier (store.Layered), which a
			// connector calls to count the tokens each tier served.
			tier := make([]int, batch)
			getTier := func() time.Duration {
				t0 := time.Now()
				if err := s.GetTier(bg, keys, regs, res, tier); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				for i, r := range res {
					if r.Err != nil || tier[i] != 0 {
						b.Fatalf("GetTier(%q) = %v, tier %d; want nil, 0", keys[i], r.Err, tier[i])
					}
				}
				return d
			}
			var tTier, tLayered, tMem []time.Duration
			b.SetBytes(int64(batch * size))
			for b.Loop() {
				tTier = append(tTier, get(s))
				tLayered = append(tLayered, getTier())
				tMem = append(tMem, get(direct))
			}
			// Medians: on a busy machine a preempted call would weigh on
			// a sum.
			b.ReportMetric(float64(median(tTier))/float64(median(tMem)), "x-memstore")
			b.ReportMetric(float64(median(tLayered))/float64(median(tMem)), "x-memstore-gettier")
			if ts := s.Tiers(); ts[1].Hits != 0 {
				b.Fatalf("the disk tier served %d hits; the benchmark is of RAM hits", ts[1].Hits)
			}
		})
	}
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}
