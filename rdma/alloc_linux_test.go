package rdma_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// BenchmarkAllocHostTouch times mapping 40 MiB with AllocHost and writing
// every byte once (the page faults of a fresh KV region), against a plain
// anonymous mmap of the same size written the same way, in the same run:
// time/plain is AllocHost's time over the plain map's (below 1 where
// transparent huge pages are available).
func BenchmarkAllocHostTouch(b *testing.B) {
	const n = 40 << 20
	touch := func(mem []byte) {
		mem[0] = 1
		for i := 1; i < len(mem); i *= 2 {
			copy(mem[i:], mem[:i])
		}
	}
	var ours, plain time.Duration
	b.SetBytes(n)
	for b.Loop() {
		start := time.Now()
		m, err := rdma.AllocHost(n)
		if err != nil {
			b.Fatal(err)
		}
		touch(m.Region().Bytes())
		if err := m.Free(); err != nil {
			b.Fatal(err)
		}
		ours += time.Since(start)

		start = time.Now()
		mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			b.Fatal(err)
		}
		touch(mem)
		if err := syscall.Munmap(mem); err != nil {
			b.Fatal(err)
		}
		plain += time.Since(start)
	}
	b.ReportMetric(float64(ours)/float64(plain), "time/plain")
}
