//go:build linux

package cudart

import (
	"testing"
)

var sink string

// BenchmarkCallOverhead measures one call into the real library through
// the binding (cudaGetErrorString: no driver needed), relative to the same
// call on a Go function of the same type ("go", the first sub-benchmark),
// and the same call on the fake table the unit tests use.
func BenchmarkCallOverhead(b *testing.B) {
	rt := openReal(b)
	var goNs float64
	goFn := func(c int32) string { return "x" }
	for i, fn := range []struct {
		name string
		f    func(int32) string
	}{{"go", goFn}, {"fake-table", newFake(12080, true).table().getErrorString}, {"native", rt.t.getErrorString}} {
		b.Run(fn.name, func(b *testing.B) {
			f := fn.f
			for b.Loop() {
				sink = f(int32(NotReady))
			}
			if i == 0 {
				goNs = nsPerOp(b)
			} else if goNs > 0 {
				b.ReportMetric(nsPerOp(b)/goNs, "x-go")
			}
		})
	}
}

// BenchmarkOpen measures Open of the real library after the first load
// (dlopen finds it loaded; the symbols are bound anew). The cold load is
// logged by TestRealOpen.
func BenchmarkOpen(b *testing.B) {
	openReal(b)
	for b.Loop() {
		if _, err := Open(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(nsPerOp(b)/1e3, "µs/open")
}
