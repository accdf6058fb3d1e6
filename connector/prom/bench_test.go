package prom_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/store"
)

// BenchmarkInstrumented measures batch calls over memstore wrapped by
// InstrumentStore against the same calls over the bare memstore, in the
// same iterations (the order alternates, so neither always runs on a
// warmer cache). It reports ns per call of each, their ratio (x-bare),
// the difference (overhead-ns/op) and the allocations per call of the
// wrapped store; ns/op and allocs/op are those of both calls together.
func BenchmarkInstrumented(b *testing.B) {
	for _, shape := range []struct{ keys, size int }{{1, 4 << 10}, {32, 64 << 10}} {
		h := newHotPath(b, shape.keys, shape.size)
		for _, tc := range h.calls(b.Context()) {
			if tc.name != "Get" && tc.name != "PutPresent" && tc.name != "Exists" {
				continue
			}
			b.Run(fmt.Sprintf("%s/keys=%d/size=%dKiB", tc.name, shape.keys, shape.size>>10), func(b *testing.B) {
				call := func(s store.Store) time.Duration {
					start := time.Now()
					if err := tc.call(s); err != nil {
						b.Fatal(err)
					}
					return time.Since(start)
				}
				var bare, wrapped time.Duration
				iter := 0
				b.ReportAllocs() // of both calls of an iteration
				for b.Loop() {
					if iter%2 == 0 {
						bare += call(h.bare)
						wrapped += call(h.wrapped)
					} else {
						wrapped += call(h.wrapped)
						bare += call(h.bare)
					}
					iter++
				}
				n := float64(iter)
				b.ReportMetric(float64(bare.Nanoseconds())/n, "bare-ns/op")
				b.ReportMetric(float64(wrapped.Nanoseconds())/n, "wrapped-ns/op")
				b.ReportMetric(float64(wrapped)/float64(bare), "x-bare")
				b.ReportMetric(float64(wrapped-bare)/n, "overhead-ns/op")
				b.ReportMetric(testing.AllocsPerRun(100, func() { _ = tc.call(h.wrapped) }), "wrapped-allocs/op")
			})
		}
	}
}
