package memstore_test

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// scaleKey returns key i of the scale benchmark: 108 bytes, shaped like
// the keys storeconn writes (tenant, namespace, rank, block hash).
func scaleKey(buf []byte, i int) string {
	buf = append(buf[:0], "tracereplay@ns1-0123456789abcdef0123456789abcdef@r0@"...)
	h := uint64(i)<<32 ^ uint64(i)*0x9e3779b97f4a7c15
	for len(buf) < 108 {
		buf = strconv.AppendUint(buf, h>>48|1<<16, 16)
		h = h*6364136223846793005 + 1442695040888963407
	}
	return string(buf[:108])
}

// scaleStore is a store of n keys of 64-byte values, filled in batches of
// 256, and what filling it cost.
type scaleStore struct {
	s          *memstore.Store
	n          int
	heap       uint64        // Go heap the store holds, after a GC
	putPerKey  time.Duration // wall time of the puts, per key
	keyBytes   int           // bytes of the keys themselves
	sampleKeys [][]string    // batches of 256 random present keys
}

func fillScale(b *testing.B, n int) *scaleStore {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	s, err := memstore.New(memstore.Config{Capacity: int64(n)*64*21/20 + 1<<20})
	if err != nil {
		b.Fatal(err)
	}
	mem, err := rdma.AllocHost(64)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Free()
	const batch = 256
	keys := make([]string, batch)
	src := make([]rdma.Region, batch)
	res := make([]store.Result, batch)
	for i := range src {
		src[i] = mem.Region()
	}
	var buf []byte
	start := time.Now()
	for i := 0; i < n; i += batch {
		k := min(batch, n-i)
		for j := range k {
			keys[j] = scaleKey(buf, i+j)
		}
		if err := s.Put(b.Context(), keys[:k], src[:k], res[:k]); err != nil {
			b.Fatal(err)
		}
		for j := range k {
			if res[j].Err != nil {
				b.Fatalf("put of key %d: %v", i+j, res[j].Err)
			}
		}
	}
	put := time.Since(start)
	clear(keys)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if got := s.Stats().Keys; got != int64(n) {
		b.Fatalf("store holds %d keys after %d puts, want all (no eviction)", got, n)
	}
	ss := &scaleStore{s: s, n: n, heap: after.HeapAlloc - before.HeapAlloc, putPerKey: put / time.Duration(n), keyBytes: 108 * n}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 64 {
		bk := make([]string, batch)
		for j := range bk {
			bk[j] = scaleKey(buf, rng.IntN(n))
		}
		ss.sampleKeys = append(ss.sampleKeys, bk)
	}
	return ss
}

// existsPerKey returns the mean time per key of batch exists of 256
// random present keys, over rounds batches: wall-clock time, and the CPU
// time of the calling thread (locked to it by the caller).
func (ss *scaleStore) existsPerKey(b *testing.B, rounds int) (wall, cpu time.Duration) {
	res := make([]store.Result, 256)
	start, startCPU := time.Now(), threadCPU()
	for r := range rounds {
		keys := ss.sampleKeys[r%len(ss.sampleKeys)]
		if err := ss.s.Exists(b.Context(), keys, res); err != nil {
			b.Fatal(err)
		}
		if res[0].Err != nil || res[0].N != 64 {
			b.Fatalf("Exists of a present key = %+v, want N 64", res[0])
		}
	}
	n := time.Duration(rounds * 256)
	return time.Since(start) / n, (threadCPU() - startCPU) / n
}

// BenchmarkIndexScale fills one store with 10,000 keys and one with
// 6,000,000 (108-byte keys, 64-byte values: the mooncake conversation trace
// at 16-token blocks names 5.7 M), then measures batch exists of random
// present keys on both, alternating, in the same iterations. It reports
// the Go heap each store's index takes per key, with and without the
// key's own 108 bytes (index-B/key, index-B/key-with-key), the put time
// per key while filling, the exists time per key at each size and their
// ratio (exists-6M/10K). Go heap allocations per op are reported by
// ReportAllocs: an op is one exists batch at each size.
//
// It needs about 2 GB of memory and a minute to fill: run it alone,
//
//	go test -run '^$' -bench IndexScale -benchtime 200x ./store/memstore/
func BenchmarkIndexScale(b *testing.B) {
	small := fillScale(b, 10_000)
	defer small.s.Close()
	large := fillScale(b, 6_000_000)
	defer large.s.Close()
	var ts, tl, cs, cl time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	for b.Loop() {
		w, c := small.existsPerKey(b, 16)
		ts, cs = ts+w, cs+c
		w, c = large.existsPerKey(b, 16)
		tl, cl = tl+w, cl+c
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64(ts/n), "exists-ns/key-10K")
	b.ReportMetric(float64(tl/n), "exists-ns/key-6M")
	b.ReportMetric(float64(tl)/float64(ts), "exists-6M/10K")
	b.ReportMetric(float64(cs/n), "exists-cpu-ns/key-10K")
	b.ReportMetric(float64(cl/n), "exists-cpu-ns/key-6M")
	b.ReportMetric(float64(cl)/float64(cs), "exists-cpu-6M/10K")
	b.ReportMetric(float64(large.heap-uint64(large.keyBytes))/float64(large.n), "index-B/key")
	b.ReportMetric(float64(large.heap)/float64(large.n), "index-B/key-with-key")
	b.ReportMetric(float64(large.putPerKey), "put-ns/key-6M")
	b.ReportMetric(float64(small.putPerKey), "put-ns/key-10K")
}
