package shm_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// BenchmarkTransfer reads batches of blocks out of a peer engine's shared
// memory and, in the same iteration, memmoves the same bytes between the
// same two mappings on one goroutine: it reports both bandwidths and their
// ratio (shm/memmove, target >= 0.8 for 16 x 2 MiB), with one copying
// worker (the engine's own overhead: a grant and a release over the
// socket per batch) and with the default pool (which copies in parallel).
// The peer is in the same process; its memory is mapped a second time, as
// in a peer process, and reached only through the socket's grants.
func BenchmarkTransfer(b *testing.B) {
	for _, workers := range []int{1, 0} {
		for _, tc := range []struct{ block, n int }{{256 << 10, 64}, {2 << 20, 16}} {
			w := "default"
			if workers > 0 {
				w = fmt.Sprint(workers)
			}
			b.Run(fmt.Sprintf("workers=%s/block=%dKiB/batch=%d", w, tc.block>>10, tc.n), func(b *testing.B) {
				benchTransfer(b, workers, tc.block, tc.n)
			})
		}
	}
}

func benchTransfer(b *testing.B, workers, block, n int) {
	a := newEngine(b, &shm.Options{Workers: workers})
	p := newEngine(b, nil)
	total := block * n
	am, pm := alloc(b, a, total), alloc(b, p, total)
	copy(pm.Bytes(), pattern(total, 3))
	for _, x := range []struct {
		e *shm.Engine
		m *shm.Memory
	}{{a, am}, {p, pm}} {
		if err := x.e.Register(x.m.Region()); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	seg, err := a.Open(ctx, p.Segment())
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]rdma.Request, n)
	for i := range reqs {
		reqs[i] = rdma.Request{Op: rdma.Read, Local: sub(b, am.Region(), i*block, block), Segment: seg, Remote: pm.Region().Addr + uintptr(i*block)}
	}
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
		for i := range n {
			if r := batch.Result(i); r.Status != rdma.Completed {
				b.Fatalf("request %d = %+v", i, r)
			}
		}
		if err := batch.Release(); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		memmove += mid.Sub(start)
		engine += end.Sub(mid)
	}
	if !bytes.Equal(am.Bytes(), pm.Bytes()) {
		b.Fatal("the bytes read differ from the peer's")
	}
	gbs := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbs(engine), "shm-GB/s")
	b.ReportMetric(gbs(memmove), "memmove-GB/s")
	b.ReportMetric(memmove.Seconds()/engine.Seconds(), "ratio")
}
