//go:build linux

package mooncake

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/kvconnect/kvconnect/internal/dl"
	"github.com/kvconnect/kvconnect/rdma"
)

// BenchmarkOverhead measures the binding's cost per request on the fake
// library, whose transfers are memmoves of 64 bytes: a whole batch through
// the binding (NewBatch, Submit, Wait, Release) against, in the same
// iteration, the same native calls made directly with a pre-built request
// array (allocateBatchID, one submitTransfer, one getTransferStatus per
// request, freeBatchID). It reports ns/req for both and their difference,
// the binding's overhead (target <= 300 ns), and the native submits per
// batch (1).
func BenchmarkOverhead(b *testing.B) {
	h := fakeHooks(b)
	for _, n := range []int{16, 256} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			a, pb := openFake(b, nil), openFake(b, nil)
			am, bm := alloc(b, n*64, 0), alloc(b, n*64, 1)
			if err := a.Register(am.Region()); err != nil {
				b.Fatal(err)
			}
			if err := pb.Register(bm.Region()); err != nil {
				b.Fatal(err)
			}
			seg, err := a.Open(context.Background(), pb.Segment())
			if err != nil {
				b.Fatal(err)
			}
			reqs := reads(am, bm, seg, n, 64)
			raw := newRawCalls(b, a, reqs)
			ctx := context.Background()
			submits0 := h.statsOf(a).Submit
			var binding, native time.Duration
			for b.Loop() {
				t0 := time.Now()
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
				t1 := time.Now()
				raw.run(b)
				native += time.Since(t1)
				binding += t1.Sub(t0)
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*n) }
			b.ReportMetric(per(binding), "binding-ns/req")
			b.ReportMetric(per(native), "native-ns/req")
			b.ReportMetric(per(binding-native), "overhead-ns/req")
			b.ReportMetric(float64(h.statsOf(a).Submit-submits0)/float64(2*b.N), "submits/batch")
		})
	}
}

// rawCalls makes the native calls of a batch directly, through SyscallN
// as the binding does for submit and status.
type rawCalls struct {
	e                         *Engine
	n                         int
	alloc, submit, stat, free uintptr
	ar                        *rdma.HostMemory // [status | requests]
}

func newRawCalls(b *testing.B, e *Engine, reqs []rdma.Request) *rawCalls {
	lib, err := dl.Open(dl.Search{Name: "fake", Names: []string{needFake(b)}})
	if err != nil {
		b.Fatal(err)
	}
	r := &rawCalls{e: e, n: len(reqs), ar: alloc(b, statusSize+len(reqs)*requestSize, 0)}
	for _, s := range []struct {
		name string
		p    *uintptr
	}{{"allocateBatchID", &r.alloc}, {"submitTransfer", &r.submit}, {"getTransferStatus", &r.stat}, {"freeBatchID", &r.free}} {
		if *s.p, err = lib.Lookup(s.name); err != nil {
			b.Fatal(err)
		}
	}
	ar := &arena{buf: r.ar.Bytes(), base: r.ar.Region().Addr}
	entries := ar.requests(statusSize, len(reqs))
	for i, q := range reqs {
		entries[i] = request{opcode: opcodeRead, source: q.Local.Addr, targetID: int32(q.Segment - 1), targetOffset: uint64(q.Remote), length: uint64(q.Local.Len)}
	}
	return r
}

func (r *rawCalls) run(b *testing.B) {
	base := r.ar.Region().Addr
	id, _, _ := purego.SyscallN(r.alloc, r.e.handle, uintptr(r.n))
	if rc, _, _ := purego.SyscallN(r.submit, r.e.handle, id, base+statusSize, uintptr(r.n)); rc != 0 {
		b.Fatalf("submit = %d", rc)
	}
	for i := range r.n {
		if rc, _, _ := purego.SyscallN(r.stat, r.e.handle, id, uintptr(i), base); rc != 0 {
			b.Fatalf("status = %d", rc)
		}
	}
	if rc, _, _ := purego.SyscallN(r.free, r.e.handle, id); rc != 0 {
		b.Fatalf("free = %d", rc)
	}
}
