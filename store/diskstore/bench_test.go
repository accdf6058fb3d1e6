//go:build linux

package diskstore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
)

// benchKey is shaped like a connector's key: tenant, namespace, rank,
// block hash.
func benchKey(i int) string {
	return fmt.Sprintf("tenant-a@%016x@r0@%064x", 0xfeedfacecafe, i)
}

// rawFile is the baseline: the same bytes moved with pwrite and pread of
// a file in the same directory, into the same aligned memory.
type rawFile struct {
	f, df *os.File // buffered; O_DIRECT (nil where refused)
	size  int
	n     int // values written
}

func newRaw(b *testing.B, dir string, size int, direct bool) *rawFile {
	path := filepath.Join(dir, "raw")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	var df *os.File
	if direct {
		if df, err = os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0); err != nil {
			df = nil
		}
	}
	b.Cleanup(func() {
		f.Close()
		if df != nil {
			df.Close()
		}
	})
	return &rawFile{f: f, df: df, size: size}
}

// op is the raw counterpart of the i-th call of the store's benchmark:
// an append (with a truncation where the store deletes its oldest
// segment), or a read of one of vals values, buffered or direct.
func (raw *rawFile) op(mode string, r rdma.Region, i, vals int) error {
	switch {
	case mode == "Put":
		if i%256 == 0 {
			if err := raw.f.Truncate(0); err != nil {
				return err
			}
		}
		_, err := raw.f.WriteAt(r.Bytes(), int64(i%256*raw.size))
		return err
	case strings.HasPrefix(mode, "GetBuffered"):
		_, err := raw.f.ReadAt(r.Bytes(), int64(i%vals*raw.size))
		return err
	}
	_, err := raw.df.ReadAt(r.Bytes(), int64(i%vals*raw.size))
	return err
}

// BenchmarkDisk times, in one loop, a raw pwrite or pread of size bytes and
// the store's Put or Get of the same bytes, and reports the store's
// throughput as a fraction of the raw one (x-raw: 1 is as fast as raw).
func BenchmarkDisk(b *testing.B) {
	for _, size := range []int{256 << 10, 2 << 20} {
		for _, mode := range []string{"Put", "GetBuffered", "GetDirect", "GetBufferedTrusted", "GetDirectTrusted"} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, size>>10), func(b *testing.B) {
				dir := b.TempDir()
				// Capacity for 64 values: reads hit the page cache unless
				// direct, as a warm store's would.
				s, err := diskstore.Open(diskstore.Config{Dir: dir, Capacity: int64(256 * size), SegmentSize: int64(32 * size), Buffered: strings.HasPrefix(mode, "GetBuffered"), TrustValues: strings.HasSuffix(mode, "Trusted")})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				raw := newRaw(b, dir, size, strings.HasPrefix(mode, "GetDirect"))
				if strings.HasPrefix(mode, "GetDirect") && (raw.df == nil || !s.IO().Direct) {
					b.Skip("the file system refuses O_DIRECT")
				}
				mem, err := rdma.AllocHost(size)
				if err != nil {
					b.Skip(err)
				}
				defer mem.Free()
				r := mem.Region()
				for i, buf := 0, r.Bytes(); i < len(buf); i++ {
					buf[i] = byte(i * 7)
				}
				res := []store.Result{{}}
				const vals = 64
				if mode != "Put" {
					for i := range vals {
						if err := s.Put(bg, []string{benchKey(i)}, []rdma.Region{r}, res); err != nil || res[0].Err != nil {
							b.Fatal(err, res[0].Err)
						}
						if _, err := raw.f.WriteAt(r.Bytes(), int64(i*size)); err != nil {
							b.Fatal(err)
						}
					}
				}
				var tRaw, tStore []time.Duration
				i := 0
				b.SetBytes(int64(size))
				for b.Loop() {
					t0 := time.Now()
					if err := raw.op(mode, r, i, vals); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					key := []string{benchKey(i % vals)}
					var err error
					if mode == "Put" {
						key[0] = benchKey(vals + i)
						err = s.Put(bg, key, []rdma.Region{r}, res)
					} else {
						err = s.Get(bg, key, []rdma.Region{r}, res)
					}
					if err != nil || res[0].Err != nil {
						b.Fatal(err, res[0].Err)
					}
					t2 := time.Now()
					tRaw = append(tRaw, t1.Sub(t0))
					tStore = append(tStore, t2.Sub(t1))
					i++
				}
				// Medians: on a busy machine a preempted call would weigh
				// on a sum.
				mr, ms := median(tRaw), median(tStore)
				b.ReportMetric(float64(mr)/float64(ms), "x-raw")
				b.ReportMetric(float64(size)/mr.Seconds()/(1<<30), "raw-GiB/s")
				b.ReportMetric(float64(size)/ms.Seconds()/(1<<30), "store-GiB/s")
			})
		}
	}
}

// BenchmarkOpen1M opens a directory of 1 M records (64-byte values under
// keys shaped like a connector's): the time to rebuild the index, and the
// heap the index holds per record.
func BenchmarkOpen1M(b *testing.B) {
	const records = 1 << 20
	dir := b.TempDir()
	cfg := diskstore.Config{Dir: dir, Capacity: 4 << 30, SegmentSize: 256 << 20}
	s, err := diskstore.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	mem, err := rdma.AllocHost(64 * 1024)
	if err != nil {
		b.Skip(err)
	}
	defer mem.Free()
	keys := make([]string, 1024)
	src := make([]rdma.Region, 1024)
	res := make([]store.Result, 1024)
	whole := mem.Region()
	for i := range src {
		r, err := whole.Sub(i*64, 64)
		if err != nil {
			b.Fatal(err)
		}
		src[i] = r
	}
	for n := 0; n < records; n += len(keys) {
		for i := range keys {
			keys[i] = benchKey(n + i)
		}
		if err := s.Put(bg, keys, src, res); err != nil {
			b.Fatal(err)
		}
	}
	if st := s.Stats(); st.Keys != records {
		b.Fatalf("%d keys stored, want %d", st.Keys, records)
	}
	s.Close()
	var perRecord float64
	for b.Loop() {
		perRecord = openMeasured(b, cfg, records)
	}
	b.ReportMetric(perRecord, "heap-B/record")
}

// openMeasured opens cfg and returns the heap it took per record, with
// the timer stopped but for the Open.
func openMeasured(b *testing.B, cfg diskstore.Config, records int64) float64 {
	var before, after runtime.MemStats
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.StartTimer()
	s, err := diskstore.Open(cfg)
	b.StopTimer()
	defer b.StartTimer()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if st := s.Stats(); st.Keys != records {
		b.Fatalf("Open found %d keys, want %d", st.Keys, records)
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(records)
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}
