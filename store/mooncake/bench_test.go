//go:build linux

package mooncake

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// rawBatch is a batch laid out once for direct calls of the C API: the
// baseline that the binding's per-call work is measured against.
type rawBatch struct {
	mem                        *rdma.HostMemory
	keys, bufs, sizes, results uintptr
}

func newRawBatch(b testing.TB, keys []string, regs []rdma.Region) *rawBatch {
	n := len(keys)
	l := newLayout(n, 0)
	text := 0
	for _, k := range keys {
		text += len(k) + 1
	}
	m := alloc(b, l.text+text)
	a := arena{mem: m.Bytes()}
	kp, bp, sp := a.words(l.keys, n), a.words(l.bufs, n), a.words(l.sizes, n)
	off := l.text
	for i, k := range keys {
		kp[i], bp[i], sp[i] = a.addr(off), regs[i].Addr, uintptr(regs[i].Len)
		off = a.cstring(off, k)
	}
	return &rawBatch{mem: m, keys: a.addr(l.keys), bufs: a.addr(l.bufs), sizes: a.addr(l.sizes), results: a.addr(l.res)}
}

// BenchmarkOverhead measures what the binding adds per key to a batch of
// 256 keys of 64 bytes, against the same native call made directly with
// arrays built in advance, alternating the two in each iteration. The
// native work (the fake's hashing and copying) is in both; the difference,
// overhead-ns/key, is the binding's: key checks, region lookups, copying
// keys into native memory, mapping results. "exists+sizes" is Exists
// without Config.PresenceOnly: one get_size call per key found on top.
func BenchmarkOverhead(b *testing.B) {
	h := fakeHooks(b)
	const n, size = 256, 64
	ctx := context.Background()
	for _, op := range []string{"exists", "exists+sizes", "put", "get"} {
		b.Run(op, func(b *testing.B) {
			s := openFake(b, func(c *Config) { c.PresenceOnly = op != "exists+sizes" })
			regs := slots(b, registered(b, s, n*size), n, size)
			keys := keysN("tenant@model@rank:0@"+op, n)
			res := make([]store.Result, n)
			if err := s.Put(ctx, keys, regs, res); err != nil {
				b.Fatal(err)
			}
			raw := newRawBatch(b, keys, regs)
			var binding, direct time.Duration
			call := func() error {
				switch op {
				case "put":
					return s.Put(ctx, keys, regs, res)
				case "get":
					return s.Get(ctx, keys, regs, res)
				}
				return s.Exists(ctx, keys, res)
			}
			rawCall := func() int32 {
				switch op {
				case "put":
					return h.batchPutFrom(s.handle, raw.keys, raw.bufs, raw.sizes, n, 0, raw.results)
				case "get":
					return h.batchGetInto(s.handle, raw.keys, raw.bufs, raw.sizes, n, raw.results)
				}
				return h.batchIsExist(s.handle, raw.keys, n, raw.results)
			}
			for b.Loop() {
				t0 := time.Now()
				if err := call(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if rc := rawCall(); rc != 0 {
					b.Fatalf("raw %s = %d", op, rc)
				}
				binding += t1.Sub(t0)
				direct += time.Since(t1)
			}
			for i, r := range res {
				if r.Err != nil {
					b.Fatalf("%s: key %d: %v", op, i, r.Err)
				}
			}
			per := float64(b.N * n)
			b.ReportMetric(float64(binding.Nanoseconds())/per, "binding-ns/key")
			b.ReportMetric(float64(direct.Nanoseconds())/per, "raw-ns/key")
			b.ReportMetric(float64((binding-direct).Nanoseconds())/per, "overhead-ns/key")
		})
	}
}

// BenchmarkLayers compares the two ways of storing KV blocks whose layers
// are not contiguous (layer-major KV memory, one tensor per layer): one
// key per block and layer (N*L keys of S/L bytes, each straight from its
// layer's tensor) against one key per block (N keys of S bytes, the
// baseline, as from block-major memory), in the same iteration. The
// ratios are the time of the split layout over the baseline's for a batch
// put (of fresh keys) and a batch get of the same bytes.
func BenchmarkLayers(b *testing.B) {
	const blocks, blockSize = 32, 512 << 10
	ctx := context.Background()
	for _, layers := range []int{4, 32, 80} {
		b.Run(fmt.Sprintf("N=%d/S=%dKiB/L=%d", blocks, blockSize>>10, layers), func(b *testing.B) {
			s := openFake(b, func(c *Config) { c.GlobalSegmentSize = 2 * blocks * blockSize })
			whole := registered(b, s, blocks*blockSize)
			wholeRegs := slots(b, whole, blocks, blockSize)
			wholeKeys := keysN("whole", blocks)
			// Layer-major: layer l holds every block's slice of that layer.
			part := blockSize / layers
			var splitKeys []string
			var splitRegs []rdma.Region
			tensors := make([]*rdma.HostMemory, layers)
			for l := range tensors {
				tensors[l] = registered(b, s, blocks*part)
			}
			for blk := range blocks {
				for l := range layers {
					r, err := tensors[l].Region().Sub(blk*part, part)
					if err != nil {
						b.Fatal(err)
					}
					splitKeys = append(splitKeys, fmt.Sprintf("split/%05d/layer:%02d", blk, l))
					splitRegs = append(splitRegs, r)
				}
			}
			resW := make([]store.Result, blocks)
			resS := make([]store.Result, len(splitKeys))
			var putW, putS, getW, getS time.Duration
			timed := func(d *time.Duration, f func() error) {
				t0 := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				*d += time.Since(t0)
			}
			for b.Loop() {
				if _, err := s.RemoveAll(ctx); err != nil {
					b.Fatal(err)
				}
				timed(&putW, func() error { return s.Put(ctx, wholeKeys, wholeRegs, resW) })
				timed(&putS, func() error { return s.Put(ctx, splitKeys, splitRegs, resS) })
				timed(&getW, func() error { return s.Get(ctx, wholeKeys, wholeRegs, resW) })
				timed(&getS, func() error { return s.Get(ctx, splitKeys, splitRegs, resS) })
			}
			for _, r := range append(resW, resS...) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
			bytes := float64(b.N) * blocks * blockSize
			b.ReportMetric(float64(putS)/float64(putW), "put-ratio")
			b.ReportMetric(float64(getS)/float64(getW), "get-ratio")
			b.ReportMetric(bytes/putW.Seconds()/1e9, "put-block-GB/s")
			b.ReportMetric(bytes/putS.Seconds()/1e9, "put-layer-GB/s")
			b.ReportMetric(bytes/getW.Seconds()/1e9, "get-block-GB/s")
			b.ReportMetric(bytes/getS.Seconds()/1e9, "get-layer-GB/s")
		})
	}
}

// BenchmarkThroughput moves 16 MiB batches of 256 KiB values through one
// client: a batch put of fresh keys and a batch get of them, against a
// plain copy of the same bytes in the same iteration (the baseline).
// "fake" uses the test library; "real" runs when MOONCAKE_STORE_LIBRARY
// and MOONCAKE_MASTER name a library and a master of its own (it removes
// every key of the cluster between iterations).
func BenchmarkThroughput(b *testing.B) {
	const n, size = 64, 256 << 10
	ctx := context.Background()
	for _, target := range []string{"fake", "real"} {
		b.Run(target, func(b *testing.B) {
			var s *Store
			if target == "fake" {
				s = openFake(b, nil)
			} else {
				cfg := realConfig(b)
				var err error
				if s, err = Open(ctx, cfg); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					if err := s.Close(); err != nil {
						b.Error(err)
					}
				})
			}
			src, dst := registered(b, s, n*size), registered(b, s, n*size)
			for i := range src.Bytes() {
				src.Bytes()[i] = byte(i * 7)
			}
			srcRegs, dstRegs := slots(b, src, n, size), slots(b, dst, n, size)
			keys := keysN("throughput", n)
			res := make([]store.Result, n)
			var put, get, cp time.Duration
			for b.Loop() {
				if _, err := s.RemoveAll(ctx); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := s.Put(ctx, keys, srcRegs, res); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				for _, r := range res {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				t2 := time.Now()
				if err := s.Get(ctx, keys, dstRegs, res); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				for _, r := range res {
					if r.Err != nil || r.N != size {
						b.Fatal(r)
					}
				}
				t4 := time.Now()
				copy(dst.Bytes(), src.Bytes())
				cp += time.Since(t4)
				put += t1.Sub(t0)
				get += t3.Sub(t2)
			}
			bytes := float64(b.N) * n * size
			b.ReportMetric(bytes/put.Seconds()/1e9, "put-GB/s")
			b.ReportMetric(bytes/get.Seconds()/1e9, "get-GB/s")
			b.ReportMetric(bytes/cp.Seconds()/1e9, "copy-GB/s")
			b.ReportMetric(float64(put)/float64(cp), "put/copy")
			b.ReportMetric(float64(get)/float64(cp), "get/copy")
		})
	}
}
