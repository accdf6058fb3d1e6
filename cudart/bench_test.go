package cudart

import (
	"fmt"
	"testing"
)

// nsPerOp returns the mean time of one b.Loop iteration so far.
func nsPerOp(b *testing.B) float64 { return float64(b.Elapsed().Nanoseconds()) / float64(b.N) }

// BenchmarkCopyBatch measures the Go side of a batch of 256 block copies
// against a fake symbol table, per batch form, and counts the native calls
// each batch makes: one (plus the device switch) where the runtime has
// cudaMemcpyBatchAsync, one per copy elsewhere. x-loop is the time of a
// batch relative to the per-copy loop, the first sub-benchmark of the run.
func BenchmarkCopyBatch(b *testing.B) {
	const n = 256
	var loopNs float64
	for i, tt := range []struct {
		name      string
		version   int32
		withBatch bool
	}{{"loop-11.8", 11080, false}, {"batch-12.8", 12080, true}, {"batch-13.0", 13000, true}} {
		b.Run(fmt.Sprintf("%s/%d-copies", tt.name, n), func(b *testing.B) {
			f := newFake(tt.version, tt.withBatch)
			f.quiet = true
			_, s := newStream(b, f)
			cs := make([]Copy, n)
			for i := range cs {
				cs[i] = Copy{Dst: uintptr(0x1000_0000 + i<<21), Src: uintptr(0x9000_0000 + i<<21), N: 2 << 20}
			}
			calls := func() int { return f.count("cudaMemcpyAsync") + f.count(batchSymbol) + f.count("cudaSetDevice") }
			before := calls()
			for b.Loop() {
				if err := s.CopyBatch(HostToDevice, cs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(calls()-before)/float64(b.N), "native-calls/op")
			if i == 0 {
				loopNs = nsPerOp(b)
			} else if loopNs > 0 {
				b.ReportMetric(nsPerOp(b)/loopNs, "x-loop")
			}
		})
	}
}

// BenchmarkDeviceCall measures one device-dependent call through the
// binding (thread lock, cudaSetDevice, cudaMemcpyAsync) against a fake
// table, relative to calling the two fake functions directly ("direct",
// the first sub-benchmark).
func BenchmarkDeviceCall(b *testing.B) {
	f := newFake(11080, false)
	f.quiet = true
	_, s := newStream(b, f)
	t := s.d.r.t
	var directNs float64
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			t.setDevice(1)
			t.memcpyAsync(0x100, 0x200, 64, int32(HostToDevice), s.handle)
		}
		directNs = nsPerOp(b)
	})
	b.Run("binding", func(b *testing.B) {
		for b.Loop() {
			if err := s.CopyAsync(HostToDevice, 0x100, 0x200, 64); err != nil {
				b.Fatal(err)
			}
		}
		if directNs > 0 {
			b.ReportMetric(nsPerOp(b)/directNs, "x-direct")
		}
	})
}
