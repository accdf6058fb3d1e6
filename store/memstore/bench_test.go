package memstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// Values of typical KV block sizes, moved in batches of batchBytes per
// goroutine.
var benchSizes = []struct {
	name string
	size int
}{{"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"2MiB", 2 << 20}}

const batchBytes = 32 << 20

// benchKey returns a key shaped like a real one: tenant, namespace, rank,
// block hash.
func benchKey(g, gen, i int) string {
	return fmt.Sprintf("tenant-a@%016x@r%d@%064x", 0xfeedfacecafe+gen, g, i)
}

// copier is one goroutine's part of a copy benchmark.
type copier struct {
	keys [][]string // per generation
	src  []rdma.Region
	dst  []rdma.Region
	res  []store.Result
}

func newCopier(b *testing.B, g, gens, size int) *copier {
	n := batchBytes / size
	c := &copier{res: make([]store.Result, n)}
	for _, out := range []*[]rdma.Region{&c.src, &c.dst} {
		mem, err := rdma.AllocHost(batchBytes)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mem.Free() })
		buf := mem.Bytes()
		for i := range buf {
			buf[i] = byte(i * 13) // fault every page in
		}
		for i := range n {
			r, err := mem.Region().Sub(i*size, size)
			if err != nil {
				b.Fatal(err)
			}
			*out = append(*out, r)
		}
	}
	for gen := range gens {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = benchKey(g, gen, i)
		}
		c.keys = append(c.keys, keys)
	}
	return c
}

// memmove copies the batch src to dst value by value with the built-in copy.
func (c *copier) memmove() {
	for i := range c.src {
		copy(c.dst[i].Bytes(), c.src[i].Bytes())
	}
}

func (c *copier) check(b *testing.B, op string, err error) {
	if err != nil {
		b.Fatalf("%s: %v", op, err)
	}
	for i, r := range c.res {
		if r.Err != nil {
			b.Fatalf("%s: key %d: %v", op, i, r.Err)
		}
	}
}

// parallel runs f on every copier at once and returns the wall time.
func parallel(cs []*copier, f func(c *copier)) time.Duration {
	start := time.Now()
	if len(cs) == 1 {
		f(cs[0])
		return time.Since(start)
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { f(c) })
	}
	wg.Wait()
	return time.Since(start)
}

// benchCopy measures batch puts (get false) or batch gets of one value
// size from g goroutines, each moving batchBytes per iteration, against
// the built-in copy of the same bytes between the same kind of memory in
// the same iterations (the order alternates, so neither always runs on a
// warmer cache). It reports both bandwidths and their ratio.
func benchCopy(b *testing.B, size, g int, get bool) {
	const gens = 8 // puts cycle through 8 key sets in room for 4: always new keys, evicting old ones
	capacity := int64(g) * 4 * batchBytes
	if get {
		capacity = int64(g) * 2 * batchBytes
	}
	s, err := memstore.New(memstore.Config{Capacity: capacity})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	cs := make([]*copier, g)
	for i := range cs {
		cs[i] = newCopier(b, i, gens, size)
	}
	ctx := b.Context()
	if get {
		for _, c := range cs {
			c.check(b, "put", s.Put(ctx, c.keys[0], c.src, c.res))
		}
	} else { // fill the store once so that the timed puts run in steady state, evicting
		for gen := range gens {
			for _, c := range cs {
				c.check(b, "put", s.Put(ctx, c.keys[gen], c.src, c.res))
			}
		}
	}
	ops := make([]func(c *copier), gens) // made up front: the loop allocates nothing of its own
	for gen := range ops {
		if get {
			ops[gen] = func(c *copier) { c.check(b, "get", s.Get(ctx, c.keys[0], c.dst, c.res)) }
		} else {
			ops[gen] = func(c *copier) { c.check(b, "put", s.Put(ctx, c.keys[gen], c.src, c.res)) }
		}
	}
	var inStore, inCopy time.Duration
	iter := 0
	before := s.Stats()
	b.ReportAllocs()
	for b.Loop() {
		if iter%2 == 0 {
			inStore += parallel(cs, ops[iter%gens])
			inCopy += parallel(cs, (*copier).memmove)
		} else {
			inCopy += parallel(cs, (*copier).memmove)
			inStore += parallel(cs, ops[iter%gens])
		}
		iter++
	}
	after := s.Stats()
	if !get && after.Duplicates != before.Duplicates {
		b.Fatalf("%d puts found their key present: the benchmark must put new keys", after.Duplicates-before.Duplicates)
	}
	bytes := float64(iter) * float64(g) * batchBytes
	storeGBs := bytes / inStore.Seconds() / 1e9
	copyGBs := bytes / inCopy.Seconds() / 1e9
	b.ReportMetric(storeGBs, "GB/s")
	b.ReportMetric(copyGBs, "memmove-GB/s")
	b.ReportMetric(storeGBs/copyGBs, "x-memmove")
	if !get {
		b.ReportMetric(float64(after.Evictions-before.Evictions)/float64(iter), "evictions/op")
	}
}

// BenchmarkPut measures batch puts of new keys into a full store (each put
// evicts old entries), against memmove of the same bytes.
func BenchmarkPut(b *testing.B) {
	for _, sz := range benchSizes {
		for _, g := range []int{1, 2} {
			b.Run(fmt.Sprintf("size=%s/goroutines=%d", sz.name, g), func(b *testing.B) { benchCopy(b, sz.size, g, false) })
		}
	}
}

// BenchmarkGet measures batch gets of present keys, against memmove of the
// same bytes.
func BenchmarkGet(b *testing.B) {
	for _, sz := range benchSizes {
		for _, g := range []int{1, 2} {
			b.Run(fmt.Sprintf("size=%s/goroutines=%d", sz.name, g), func(b *testing.B) { benchCopy(b, sz.size, g, true) })
		}
	}
}

// BenchmarkExists measures batch exists of 1,000 keys per goroutine, all
// present or all absent, and reports the time per key of one batch.
func BenchmarkExists(b *testing.B) {
	const n = 1000
	for _, present := range []bool{true, false} {
		for _, g := range []int{1, 2} {
			b.Run(fmt.Sprintf("present=%v/goroutines=%d", present, g), func(b *testing.B) {
				s, err := memstore.New(memstore.Config{Capacity: 64 << 20})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				mem, err := rdma.AllocHost(64)
				if err != nil {
					b.Fatal(err)
				}
				defer mem.Free()
				keys := make([][]string, g)
				for w := range keys {
					for i := range n {
						keys[w] = append(keys[w], benchKey(w, 0, i))
					}
					if present {
						src := make([]rdma.Region, n)
						for i := range src {
							src[i] = mem.Region()
						}
						if err := s.Put(b.Context(), keys[w], src, make([]store.Result, n)); err != nil {
							b.Fatal(err)
						}
					}
				}
				res := make([][]store.Result, g)
				for w := range res {
					res[w] = make([]store.Result, n)
				}
				ctx := b.Context()
				var elapsed time.Duration
				b.ReportAllocs()
				for b.Loop() {
					start := time.Now()
					if g == 1 {
						if err := s.Exists(ctx, keys[0], res[0]); err != nil {
							b.Fatal(err)
						}
					} else {
						var wg sync.WaitGroup
						for w := range g {
							wg.Go(func() {
								if err := s.Exists(ctx, keys[w], res[w]); err != nil {
									b.Error(err)
								}
							})
						}
						wg.Wait()
					}
					elapsed += time.Since(start)
				}
				if got := res[0][n-1].Err == nil; got != present {
					b.Fatalf("Exists found key %d: %v, want %v", n-1, got, present)
				}
				b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*n), "ns/key")
			})
		}
	}
}

// BenchmarkGetV measures a batch GetV of values split across several
// regions each (a block and its trailer, or a block's layers) against a
// batch Get of the same values into one region each, the same bytes, in
// the same iterations (alternating which goes first). x-get is the time
// of GetV over the time of Get: 1 means that scattering costs nothing.
func BenchmarkGetV(b *testing.B) {
	for _, sz := range benchSizes {
		for _, parts := range []int{2, 8} {
			b.Run(fmt.Sprintf("size=%s/regions=%d", sz.name, parts), func(b *testing.B) {
				s, err := memstore.New(memstore.Config{Capacity: 2 * batchBytes})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				c := newCopier(b, 0, 1, sz.size)
				ctx := b.Context()
				c.check(b, "put", s.Put(ctx, c.keys[0], c.src, c.res))
				// The same destination bytes, cut into parts: a short last
				// part (a trailer) when there are two, equal parts otherwise.
				vdst := make([][]rdma.Region, len(c.dst))
				for i, d := range c.dst {
					cuts := []int{0}
					if parts == 2 {
						cuts = append(cuts, d.Len-64)
					} else {
						for p := 1; p < parts; p++ {
							cuts = append(cuts, p*d.Len/parts)
						}
					}
					cuts = append(cuts, d.Len)
					for p := range parts {
						r, err := d.Sub(cuts[p], cuts[p+1]-cuts[p])
						if err != nil {
							b.Fatal(err)
						}
						vdst[i] = append(vdst[i], r)
					}
				}
				var inGet, inGetV time.Duration
				get := func() {
					t0 := time.Now()
					c.check(b, "get", s.Get(ctx, c.keys[0], c.dst, c.res))
					inGet += time.Since(t0)
				}
				getV := func() {
					t0 := time.Now()
					c.check(b, "getv", s.GetV(ctx, c.keys[0], vdst, c.res))
					inGetV += time.Since(t0)
				}
				iter := 0
				b.ReportAllocs()
				for b.Loop() {
					if iter%2 == 0 {
						get()
						getV()
					} else {
						getV()
						get()
					}
					iter++
				}
				bytes := float64(iter) * batchBytes
				b.ReportMetric(bytes/inGetV.Seconds()/1e9, "getv-GB/s")
				b.ReportMetric(bytes/inGet.Seconds()/1e9, "get-GB/s")
				b.ReportMetric(inGetV.Seconds()/inGet.Seconds(), "x-get")
			})
		}
	}
}
