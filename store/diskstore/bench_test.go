//go:build linux

package diskstore_test

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

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
// files in the same directory, from and into the same aligned memory, in
// the store's pattern: appends to files of segment values each, the
// oldest deleted past the capacity, and no sync (the store syncs none).
type rawFile struct {
	dir     string
	f, df   *os.File // the file read: buffered; O_DIRECT (nil where refused)
	size    int
	segVals int      // values per file, as the store's segments
	keep    int      // files kept, as the store's capacity
	files   []string // written files, oldest first
	w       *os.File // the file being appended to
}

func newRaw(b *testing.B, dir string, size, segVals, keep int, direct bool) *rawFile {
	raw := &rawFile{dir: dir, size: size, segVals: segVals, keep: keep}
	path := filepath.Join(dir, "raw")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	raw.f = f
	if direct {
		if raw.df, err = os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0); err != nil {
			raw.df = nil
		}
	}
	b.Cleanup(func() {
		f.Close()
		if raw.df != nil {
			raw.df.Close()
		}
		if raw.w != nil {
			raw.w.Close()
		}
	})
	return raw
}

// put is the raw counterpart of the store's i-th put: an append to the
// current file, starting a new one (and deleting the oldest past keep)
// every segVals values.
func (raw *rawFile) put(r rdma.Region, i int) error {
	if i%raw.segVals == 0 {
		if raw.w != nil {
			if err := raw.w.Close(); err != nil {
				return err
			}
		}
		path := filepath.Join(raw.dir, fmt.Sprintf("raw-%d", i/raw.segVals))
		w, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		raw.w = w
		raw.files = append(raw.files, path)
		if len(raw.files) > raw.keep {
			if err := os.Remove(raw.files[0]); err != nil {
				return err
			}
			raw.files = raw.files[1:]
		}
	}
	_, err := raw.w.WriteAt(r.Bytes(), int64(i%raw.segVals*raw.size))
	return err
}

// get is the raw counterpart of a store's Get of value i: a pread of the
// same bytes into the same memory, buffered or direct.
func (raw *rawFile) get(r rdma.Region, i int, direct bool) error {
	f := raw.f
	if direct {
		f = raw.df
	}
	_, err := f.ReadAt(r.Bytes(), int64(i*raw.size))
	return err
}

// threadCPU is the CPU time of the calling thread: what a call cost,
// whatever else runs on the machine.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// pairTimer times a raw call and a store call taken in turns, the order
// swapped every iteration so that neither always runs first (and finds
// the caches the other left), both under the same load.
type pairTimer struct {
	wall, cpu [2][]time.Duration // [0] raw, [1] store
}

func (p *pairTimer) time(which int, f func() error) error {
	c0, t0 := threadCPU(), time.Now()
	err := f()
	p.wall[which] = append(p.wall[which], time.Since(t0))
	p.cpu[which] = append(p.cpu[which], threadCPU()-c0)
	return err
}

// report reports the store's speed as a fraction of the raw one, by
// medians of wall-clock time (x-raw), by total time (sum-x-raw: what a
// stream of calls gets, the rare slow ones included, such as a write
// throttled by the kernel or a file deleted), and by medians of the
// thread's CPU time (cpu-x-raw: what a call costs, which a busy machine
// disturbs less), and both throughputs.
func (p *pairTimer) report(b *testing.B, size int) {
	mr, ms := median(p.wall[0]), median(p.wall[1])
	b.ReportMetric(float64(mr)/float64(ms), "x-raw")
	b.ReportMetric(float64(sum(p.wall[0]))/float64(sum(p.wall[1])), "sum-x-raw")
	if cr, cs := median(p.cpu[0]), median(p.cpu[1]); cr > 0 && cs > 0 {
		b.ReportMetric(float64(cr)/float64(cs), "cpu-x-raw")
	}
	b.ReportMetric(float64(size)/mr.Seconds()/(1<<30), "raw-GiB/s")
	b.ReportMetric(float64(size)/ms.Seconds()/(1<<30), "store-GiB/s")
}

// BenchmarkDisk times, in one loop, a raw pwrite or pread of size bytes and
// the store's Put or Get of the same bytes, in turns, and reports the
// store's throughput as a fraction of the raw one (x-raw: 1 is as fast as
// raw). Gets read one of 64 values: GetBuffered with Config.Buffered,
// GetCached with direct I/O on (the default) and the values in the page
// cache, as a warm store's are, both against a buffered pread; GetDirect
// once the page cache has dropped them, against an O_DIRECT pread.
// Trusted is with Config.TrustValues.
func BenchmarkDisk(b *testing.B) {
	for _, size := range []int{256 << 10, 2 << 20} {
		for _, mode := range []string{"Put", "GetBuffered", "GetBufferedTrusted", "GetCached", "GetCachedTrusted", "GetDirect", "GetDirectTrusted"} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, size>>10), func(b *testing.B) {
				runtime.LockOSThread() // for threadCPU
				defer runtime.UnlockOSThread()
				const segVals, segs = 32, 8
				dir := b.TempDir()
				// GetCached and GetDirect run with direct I/O on (the
				// default), the page cache holding the values or not.
				direct := strings.HasPrefix(mode, "GetDirect")
				buffered := mode == "Put" || strings.HasPrefix(mode, "GetBuffered")
				s, err := diskstore.Open(diskstore.Config{Dir: dir, Capacity: int64(segs * segVals * size), SegmentSize: int64(segVals * size), Buffered: buffered, TrustValues: strings.HasSuffix(mode, "Trusted")})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				raw := newRaw(b, dir, size, segVals, segs-1, direct)
				if direct && (raw.df == nil || !s.IO().Direct) {
					b.Skip("the file system refuses O_DIRECT")
				}
				if strings.HasPrefix(mode, "GetCached") && s.IO().Direct && !cachestatWorks(b) {
					b.Skip("the kernel has no cachestat (Linux 6.5): these reads would be direct")
				}
				r := valueRegion(b, size)
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
				if direct {
					dropCache(b, dir) // reads go to the device, the store's and the raw ones
				}
				var p pairTimer
				// The key and the slices a call takes are made before the
				// timer starts: formatting a key takes about a microsecond,
				// a tenth of a raw read of 256 KiB.
				rs := []rdma.Region{r}
				storeOp := func(i int) func() error {
					key := []string{benchKey(i % vals)}
					if mode == "Put" {
						key[0] = benchKey(vals + i)
					}
					return func() error {
						var err error
						if mode == "Put" {
							err = s.Put(bg, key, rs, res)
						} else {
							err = s.Get(bg, key, rs, res)
						}
						if err == nil {
							err = res[0].Err
						}
						return err
					}
				}
				rawOp := func(i int) func() error {
					return func() error {
						if mode == "Put" {
							return raw.put(r, i)
						}
						return raw.get(r, i%vals, direct)
					}
				}
				i := 0
				b.SetBytes(int64(size))
				for b.Loop() {
					first := i % 2 // 0: raw first
					for k := range 2 {
						which := first ^ k
						op := rawOp(i)
						if which == 1 {
							op = storeOp(i)
						}
						if err := p.time(which, op); err != nil {
							b.Fatal(err)
						}
					}
					i++
				}
				p.report(b, size)
				switch st := s.IO(); {
				case direct && st.BufferedReads != 0:
					b.Fatalf("%d buffered reads in a direct benchmark", st.BufferedReads)
				case !direct && st.DirectReads != 0:
					b.Fatalf("%d direct reads of values the page cache holds", st.DirectReads)
				}
			})
		}
	}
}

// BenchmarkReadBounds measures what bounds a read the page cache serves,
// apart from the store's own work: in turns, a raw pread of a value
// stored at a multiple of its size (the baseline of BenchmarkDisk), a
// pread of the same bytes where the store laid them out (after their
// record's header, at a multiple of 4 KiB), and a CRC-32C pass over
// them, as a checked Get runs. It reports the store's layout against the
// raw one (layout-x-raw: the ceiling of a Get with TrustValues) and a
// raw read followed by the checksum pass against the raw read alone
// (checked-x-raw: the ceiling of a checked Get, for which no layout
// helps). The page cache keeps a file in folios as large as the writes'
// alignment lets it; a value that starts 4 KiB past a multiple of its
// size is held in smaller ones, which a read walks one by one.
func BenchmarkReadBounds(b *testing.B) {
	for _, size := range []int{256 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			// 128 MiB of values in each layout, more than the processor's
			// caches hold, so that every read copies from memory.
			vals, segVals := 128<<20/size, 32
			dir := b.TempDir()
			s, err := diskstore.Open(diskstore.Config{Dir: dir, Capacity: int64(4 * vals * size), SegmentSize: int64(segVals * (size + 8192)), Buffered: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			raw := newRaw(b, dir, size, segVals, vals, false)
			r := valueRegion(b, size)
			type at struct {
				f   *os.File
				off int64
			}
			stored := make([]at, vals)
			files := map[string]*os.File{}
			res := []store.Result{{}}
			for i := range vals {
				if err := s.Put(bg, []string{benchKey(i)}, []rdma.Region{r}, res); err != nil || res[0].Err != nil {
					b.Fatal(err, res[0].Err)
				}
				if _, err := raw.f.WriteAt(r.Bytes(), int64(i*size)); err != nil {
					b.Fatal(err)
				}
				path, off, ok := diskstore.ValueLoc(s, benchKey(i))
				if !ok {
					b.Fatalf("value %d is not in the index", i)
				}
				if files[path] == nil {
					f, err := os.Open(path)
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					files[path] = f
				}
				stored[i] = at{files[path], off}
			}
			var rawT, layoutT, crcT []time.Duration
			var sink uint32
			i := 0
			timed := func(d *[]time.Duration, f func() error) {
				t0 := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				*d = append(*d, time.Since(t0))
			}
			for b.Loop() {
				v := i % vals
				readRaw := func() error { return raw.get(r, v, false) }
				readLayout := func() error { _, err := stored[v].f.ReadAt(r.Bytes(), stored[v].off); return err }
				if i%2 == 0 {
					timed(&rawT, readRaw)
					timed(&layoutT, readLayout)
				} else {
					timed(&layoutT, readLayout)
					timed(&rawT, readRaw)
				}
				timed(&crcT, func() error { sink += crc32.Checksum(r.Bytes(), castagnoli); return nil })
				i++
			}
			if sink == 1 {
				b.Log(sink) // keeps the checksums
			}
			mr, ml, mc := median(rawT), median(layoutT), median(crcT)
			b.ReportMetric(float64(mr)/float64(ml), "layout-x-raw")
			b.ReportMetric(float64(mr)/float64(mr+mc), "checked-x-raw")
			b.ReportMetric(float64(size)/mr.Seconds()/(1<<30), "raw-GiB/s")
			b.ReportMetric(float64(size)/mc.Seconds()/(1<<30), "crc-GiB/s")
		})
	}
}

// valueRegion returns a region of registered host memory of size bytes,
// filled with a pattern, freed when b ends; it skips b where such memory
// can't be had.
func valueRegion(b *testing.B, size int) rdma.Region {
	mem, err := rdma.AllocHost(size)
	if err != nil {
		b.Skip(err)
	}
	b.Cleanup(func() { mem.Free() })
	r := mem.Region()
	for i, buf := 0, r.Bytes(); i < len(buf); i++ {
		buf[i] = byte(i * 7)
	}
	return r
}

// BenchmarkOpen1M opens a directory of 1 M records (64-byte values under
// keys shaped like a connector's, all in one segment of 256 MiB, so that
// the scan is not spread over segments): the time to rebuild the index,
// its CPU time, and the heap the index holds per record.
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
	var cpu time.Duration
	for b.Loop() {
		c0 := processCPU(b)
		perRecord = openMeasured(b, cfg, records)
		cpu += processCPU(b) - c0
	}
	b.ReportMetric(perRecord, "heap-B/record")
	// CPU time of every thread, the measuring GCs included: what Open
	// costs on a machine busy with other work.
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
}

// processCPU is the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}
