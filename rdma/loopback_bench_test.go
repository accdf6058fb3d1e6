//go:build unix

package rdma_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// BenchmarkLoopback reads batches of blocks from a peer engine and, in the
// same iteration, memmoves the same bytes between the same buffers on one
// goroutine: it reports both bandwidths and their ratio (loopback/memmove,
// target >= 0.8 for 2 MiB blocks), with one copying worker (the engine's
// own overhead) and with the default pool (which copies in parallel).
// Sizes below 64 KiB also report the engine's time per request.
func BenchmarkLoopback(b *testing.B) {
	for _, workers := range []int{1, 0} {
		for _, tc := range []struct{ block, n int }{{64, 256}, {4 << 10, 256}, {256 << 10, 64}, {2 << 20, 16}} {
			name := fmt.Sprintf("workers=%d/block=%s/batch=%d", workers, size(tc.block), tc.n)
			if workers == 0 {
				name = fmt.Sprintf("workers=default/block=%s/batch=%d", size(tc.block), tc.n)
			}
			b.Run(name, func(b *testing.B) { benchLoopback(b, workers, tc.block, tc.n) })
		}
	}
}

func benchLoopback(b *testing.B, workers, block, n int) {
	f := rdma.NewFabric()
	a := newEngine(b, f, "a", &rdma.LoopbackOptions{Workers: workers})
	p := newEngine(b, f, "p", nil)
	total := block * n
	am, pm := alloc(b, total, 0), alloc(b, total, 1)
	pattern(pm.Bytes(), 3)
	register(b, a, am.Region())
	register(b, p, pm.Region())
	seg := open(b, a, "p")
	reqs := make([]rdma.Request, n)
	for i := range reqs {
		reqs[i] = rdma.Request{Op: rdma.Read, Local: sub(b, am.Region(), i*block, block), Segment: seg, Remote: pm.Region().Addr + uintptr(i*block)}
	}
	ctx := context.Background()
	var engine, memmove time.Duration
	b.SetBytes(int64(total))
	for b.Loop() {
		start := time.Now()
		dst, src := am.Bytes(), pm.Bytes()
		for i := 0; i < total; i += block {
			copy(dst[i:i+block], src[i:i+block])
		}
		mid := time.Now()
		batch, err := a.NewBatch(n)
		if err != nil {
			b.Fatal(err)
		}
		if err := batch.Submit(reqs); err != nil {
			b.Fatal(err)
		}
		if err := batch.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		if err := batch.Release(); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		memmove += mid.Sub(start)
		engine += end.Sub(mid)
	}
	gbs := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbs(engine), "loopback-GB/s")
	b.ReportMetric(gbs(memmove), "memmove-GB/s")
	b.ReportMetric(memmove.Seconds()/engine.Seconds(), "ratio")
	if block < 64<<10 {
		b.ReportMetric(float64((engine-memmove).Nanoseconds())/float64(b.N*n), "overhead-ns/req")
	}
}

func size(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
