package diskstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
)

var bg = context.Background()

// buf is host memory for values, freed when the test ends.
func buf(t testing.TB, n int) rdma.Region {
	t.Helper()
	m, err := rdma.AllocHost(n)
	if err != nil {
		t.Skipf("host memory: %v", err)
	}
	t.Cleanup(func() { m.Free() })
	return m.Region()
}

// fill writes the value of key i, of n bytes, into r.
func fill(r rdma.Region, i, n int) rdma.Region {
	b := r.Bytes()[:n]
	for j := range b {
		b[j] = byte(i*131 + j*7 + j>>8)
	}
	r.Len = n
	return r
}

func put(t testing.TB, s store.Store, key string, src rdma.Region) {
	t.Helper()
	res := []store.Result{{}}
	if err := s.Put(bg, []string{key}, []rdma.Region{src}, res); err != nil || res[0].Err != nil {
		t.Fatalf("Put(%q) = %v, %v; want nil", key, err, res[0].Err)
	}
}

// get reads key into dst and returns its bytes and the per-key error.
func get(t testing.TB, s store.Store, key string, dst rdma.Region) ([]byte, error) {
	t.Helper()
	res := []store.Result{{}}
	if err := s.Get(bg, []string{key}, []rdma.Region{dst}, res); err != nil {
		t.Fatalf("Get(%q) = %v", key, err)
	}
	if res[0].Err != nil {
		return nil, res[0].Err
	}
	return dst.Bytes()[:res[0].N], nil
}

func segments(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

// TestReopen stores values of several sizes, removes some, closes and
// opens the directory again: the values are there, whole, and the removed
// keys stay removed.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := diskstore.Config{Dir: dir, Capacity: 64 << 20, SegmentSize: 1 << 20}
	s := open(t, cfg)
	src, dst := buf(t, 256<<10), buf(t, 256<<10)
	sizes := []int{1, 100, 4096, 16 << 10, 64 << 10, 256 << 10, 5000}
	for i := range 40 {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, sizes[i%len(sizes)]))
	}
	for _, k := range []string{"k3", "k17"} {
		if err := s.Remove(bg, k); err != nil {
			t.Fatalf("Remove(%q) = %v", k, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	defer s.Close()
	for i := range 40 {
		key := fmt.Sprintf("k%d", i)
		got, err := get(t, s, key, dst)
		if i == 3 || i == 17 {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(%q) after Remove and reopen = %v, want store.ErrNotFound", key, err)
			}
			continue
		}
		want := fill(src, i, sizes[i%len(sizes)]).Bytes()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Get(%q) after reopen = %d bytes, %v; want its %d bytes", key, len(got), err, len(want))
		}
	}
	if st := s.Stats(); st.Keys != 38 {
		t.Errorf("Stats().Keys after reopen = %d, want 38", st.Keys)
	}
	if n, err := s.RemoveAll(bg); n != 38 || err != nil {
		t.Errorf("RemoveAll() = %d, %v; want 38, nil", n, err)
	}
	put(t, s, "after", fill(src, 1, 10))
	s.Close()
	s = open(t, cfg)
	defer s.Close()
	if st := s.Stats(); st.Keys != 1 {
		t.Errorf("Stats().Keys after RemoveAll, a put and reopen = %d, want 1", st.Keys)
	}
}

// TestSecondOpen opens a directory that is open: it fails naming the
// process that holds it; once closed, it opens.
func TestSecondOpen(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 4 << 20}
	s := open(t, cfg)
	_, err := diskstore.Open(cfg)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("in use by process %d", os.Getpid())) {
		t.Errorf("second Open = %v, want an error naming process %d", err, os.Getpid())
	}
	s.Close()
	s = open(t, cfg)
	s.Close()
}

// TestNotWritable opens a directory that cannot be created or written.
func TestNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := diskstore.Open(diskstore.Config{Dir: filepath.Join(file, "dir"), Capacity: 4 << 20})
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("Open under a file = %v, want an error naming %s", err, file)
	}
	if os.Getuid() == 0 {
		return // root writes anywhere
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	_, err = diskstore.Open(diskstore.Config{Dir: dir, Capacity: 4 << 20})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open of a read-only directory = %v, want an error naming %s", err, dir)
	}
}

// TestConfig refuses configurations out of range, naming the field.
func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg   diskstore.Config
		field string
	}{
		{diskstore.Config{Capacity: 4 << 20}, "Dir"},
		{diskstore.Config{Dir: "x", Capacity: 4 << 20, SegmentSize: 1000}, "SegmentSize"},
		{diskstore.Config{Dir: "x", Capacity: 1 << 20, SegmentSize: 1 << 20}, "Capacity"},
		{diskstore.Config{Dir: "x", Capacity: 0}, "SegmentSize"},
	} {
		if _, err := diskstore.Open(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Open(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}

// TestNoSpace fails the writes as a full disk does: the put fails with
// store.ErrNoSpace naming the file, and nothing of it is visible, then or
// after a reopen.
func TestNoSpace(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 4 << 20}
	s := open(t, cfg)
	src := buf(t, 64<<10)
	put(t, s, "before", fill(src, 1, 5000))
	diskstore.SetWrite(s, func(f *os.File, bufs [][]byte, off int64) (int, error) {
		// Half the first buffer lands, then the disk is full.
		n, err := f.WriteAt(bufs[0][:len(bufs[0])/2], off)
		if err != nil {
			return n, err
		}
		return n, syscall.ENOSPC
	})
	keys := []string{"a", "b"}
	res := make([]store.Result, 2)
	if err := s.Put(bg, keys, []rdma.Region{fill(src, 2, 64<<10), fill(src, 2, 64<<10)}, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !errors.Is(r.Err, store.ErrNoSpace) || !strings.Contains(r.Err.Error(), ".seg") || r.N != 0 {
			t.Errorf("Put(%q) on a full disk = %d, %v; want store.ErrNoSpace naming the segment file", keys[i], r.N, r.Err)
		}
	}
	ex := make([]store.Result, 2)
	s.Exists(bg, keys, ex)
	for i, r := range ex {
		if !errors.Is(r.Err, store.ErrNotFound) {
			t.Errorf("Exists(%q) after a failed put = %v, want store.ErrNotFound", keys[i], r.Err)
		}
	}
	if st := s.Stats(); st.RejectedPuts != 2 {
		t.Errorf("Stats().RejectedPuts = %d, want 2", st.RejectedPuts)
	}
	diskstore.SetWrite(s, nil)
	put(t, s, "after", fill(src, 3, 5000))
	s.Close()
	s = open(t, cfg)
	defer s.Close()
	dst := buf(t, 64<<10)
	for _, k := range keys {
		if _, err := get(t, s, k, dst); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%q) after reopen = %v, want store.ErrNotFound", k, err)
		}
	}
	for i, k := range []string{"before", "after"} {
		got, err := get(t, s, k, dst)
		if want := fill(src, 2*i+1, 5000).Bytes(); err != nil || !bytes.Equal(got, want) {
			t.Errorf("Get(%q) after reopen = %v, want its value", k, err)
		}
	}
}

// damaged stores keys k0..k9 of size bytes, closes the store, lets hurt
// change the one segment file, and reopens it, logging into log.
func damaged(t *testing.T, size int, hurt func(path string, data []byte) []byte, log *bytes.Buffer) (*diskstore.Store, rdma.Region) {
	t.Helper()
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 16 << 20}
	s := open(t, cfg)
	src := buf(t, size)
	for i := range 10 {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, size))
	}
	s.Close()
	segs := segments(t, cfg.Dir)
	if len(segs) != 1 {
		t.Fatalf("%d segment files, want 1", len(segs))
	}
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(segs[0], hurt(segs[0], data), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	return open(t, cfg), src
}

// recordAt returns the offset of the record of key in data.
func recordAt(t *testing.T, data []byte, key string) int {
	t.Helper()
	i := bytes.Index(data, []byte(key))
	if i < 32 {
		t.Fatalf("no record of %q", key)
	}
	return i - 32
}

// TestCorrupt damages segment files: a flipped byte in a value, a flipped
// byte in a header, a file cut in the middle of its last value, and a
// forged header that claims 2^62 bytes. The damaged record is never
// served, counted, and the others are.
func TestCorrupt(t *testing.T) {
	const size = 3000
	for _, tc := range []struct {
		name    string
		hurt    func(t *testing.T, data []byte) []byte
		lost    string // the key whose record is damaged
		corrupt int64  // IO().Corrupt after the gets
		skipped bool   // IO().Skipped > 0 after Open
		log     string // in what Open logged
	}{
		{"ValueByte", func(t *testing.T, d []byte) []byte {
			d[recordAt(t, d, "k4")+32+8+100] ^= 0x40
			return d
		}, "k4", 1, false, ""},
		{"HeaderByte", func(t *testing.T, d []byte) []byte {
			d[recordAt(t, d, "k6")+9] ^= 1 // the value length
			return d
		}, "k6", 0, true, "checksum"},
		{"Truncated", func(t *testing.T, d []byte) []byte {
			return d[:recordAt(t, d, "k9")+32+8+size/2]
		}, "k9", 0, true, "torn write"},
		{"Claims2To62", func(t *testing.T, d []byte) []byte {
			at := recordAt(t, d, "k2")
			diskstore.PutHeader(d[at:], 1, "k2", 1<<62, int64(at), 0)
			return d
		}, "k2", 0, true, "value length 4611686018427387904"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			s, src := damaged(t, size, func(_ string, d []byte) []byte { return tc.hurt(t, d) }, &log)
			defer s.Close()
			if io := s.IO(); (io.Skipped > 0) != tc.skipped {
				t.Errorf("IO() after Open = %+v, want Skipped > 0: %v", io, tc.skipped)
			}
			if !strings.Contains(log.String(), tc.log) || tc.skipped && !strings.Contains(log.String(), ".seg") {
				t.Errorf("Open logged %q, want it to name the file and %q", log.String(), tc.log)
			}
			dst := buf(t, size)
			for i := range 10 {
				key := fmt.Sprintf("k%d", i)
				got, err := get(t, s, key, dst)
				if key == tc.lost {
					if !errors.Is(err, store.ErrNotFound) {
						t.Errorf("Get(%q) of the damaged record = %v, want store.ErrNotFound", key, err)
					}
					continue
				}
				if want := fill(src, i, size).Bytes(); err != nil || !bytes.Equal(got, want) {
					t.Errorf("Get(%q) = %v, want its value whole", key, err)
				}
			}
			if io := s.IO(); io.Corrupt != tc.corrupt {
				t.Errorf("IO().Corrupt = %d, want %d", io.Corrupt, tc.corrupt)
			}
			// A damaged record found by a Get is dropped.
			if _, err := get(t, s, tc.lost, dst); !errors.Is(err, store.ErrNotFound) || s.IO().Corrupt != tc.corrupt {
				t.Errorf("second Get(%q) = %v, IO().Corrupt %d; want store.ErrNotFound, still %d", tc.lost, err, s.IO().Corrupt, tc.corrupt)
			}
		})
	}
}

// TestEvictsWholeSegments fills a small store several times over: it
// stays within its capacity in files, evicts, and reads back the values it
// still holds whole, while a feed hears of each key stored and evicted.
func TestEvictsWholeSegments(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	defer s.Close()
	feed, err := s.Watch(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := buf(t, 8192), buf(t, 8192)
	for i := range 300 {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
		var size int64
		for _, p := range segments(t, cfg.Dir) {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			size += fi.Size()
		}
		if size > cfg.Capacity {
			t.Fatalf("after %d puts the segment files hold %d bytes, more than the capacity %d", i+1, size, cfg.Capacity)
		}
	}
	st := s.Stats()
	if st.Evictions == 0 || st.Keys+st.Evictions != 300 {
		t.Errorf("Stats() = %+v, want evictions and Keys+Evictions = 300", st)
	}
	held := 0
	for i := range 300 {
		got, err := get(t, s, fmt.Sprintf("k%d", i), dst)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		held++
		if want := fill(src, i, 8000).Bytes(); err != nil || !bytes.Equal(got, want) {
			t.Errorf("Get(k%d) = %v, want its value whole", i, err)
		}
	}
	if int64(held) != st.Keys {
		t.Errorf("%d keys read back, Stats().Keys = %d", held, st.Keys)
	}
	evs, lost := feed.Take(nil)
	var stored, evicted int64
	for _, e := range evs {
		switch e.Op {
		case store.KeyStored:
			stored++
		case store.KeyEvicted:
			evicted++
		}
	}
	if lost != 0 || stored != 300 || evicted != st.Evictions {
		t.Errorf("feed: %d stored, %d evicted, %d lost; want 300, %d, 0", stored, evicted, lost, st.Evictions)
	}
}

// TestDirectReads reads values of whole pages into page-aligned memory,
// once the page cache has dropped them: with direct I/O where the file
// system takes it, through the page cache with Config.Buffered, and the
// bytes are the same.
func TestDirectReads(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		dir := t.TempDir()
		s := open(t, diskstore.Config{Dir: dir, Capacity: 16 << 20, Buffered: buffered})
		src, dst := buf(t, 256<<10), buf(t, 256<<10)
		put(t, s, "k", fill(src, 5, 256<<10))
		dropCache(t, dir)
		got, err := get(t, s, "k", dst)
		if err != nil || !bytes.Equal(got, src.Bytes()) {
			t.Errorf("Buffered %v: Get = %v, want the value", buffered, err)
		}
		io := s.IO()
		switch {
		case buffered && (io.Direct || io.DirectReads != 0):
			t.Errorf("Buffered: IO() = %+v, want no direct reads", io)
		case !buffered && io.Direct && io.DirectReads != 1:
			t.Errorf("direct I/O available: IO() = %+v, want 1 direct read", io)
		}
		t.Logf("Buffered %v: %+v", buffered, io)
		s.Close()
	}
}

// TestCloseDuringCalls closes the store while goroutines put and get:
// every call either succeeds correctly or fails with store.ErrClosed.
func TestCloseDuringCalls(t *testing.T) {
	s := open(t, diskstore.Config{Dir: t.TempDir(), Capacity: 16 << 20})
	var wg, started sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		src, dst := buf(t, 4096), buf(t, 4096)
		started.Add(1)
		wg.Go(func() {
			once := sync.OnceFunc(started.Done)
			defer once()
			for i := 0; ; i++ {
				if i == 10 {
					once()
				}
				key := fmt.Sprintf("g%d-%d", g, i)
				res := []store.Result{{}}
				err := s.Put(bg, []string{key}, []rdma.Region{fill(src, i, 4096)}, res)
				if errors.Is(err, store.ErrClosed) {
					return
				}
				if err != nil || res[0].Err != nil {
					errs <- fmt.Errorf("Put(%q) = %v, %v", key, err, res[0].Err)
					return
				}
				err = s.Get(bg, []string{key}, []rdma.Region{dst}, res)
				if errors.Is(err, store.ErrClosed) {
					return
				}
				if err != nil || res[0].Err != nil || !bytes.Equal(dst.Bytes(), fill(src, i, 4096).Bytes()) {
					errs <- fmt.Errorf("Get(%q) = %v, %v or other bytes", key, err, res[0].Err)
					return
				}
			}
		})
	}
	// Close once every goroutine has made some calls (or failed).
	started.Wait()
	if err := s.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestEvictionAfterReopen evicts segments that a restarted store found on
// disk: their keys leave the index (Exists, Get and Stats agree), and a
// key removed from an evicted segment and stored again in a later one
// stays.
func TestEvictionAfterReopen(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	src, dst := buf(t, 8192), buf(t, 8192)
	for i := range 20 { // about 3 segments
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
	}
	if err := s.Remove(bg, "k0"); err != nil {
		t.Fatal(err)
	}
	put(t, s, "k0", fill(src, 1000, 8000))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, cfg)
	defer s.Close()
	for i := 20; s.Stats().Evictions < 10; i++ {
		if i > 1000 {
			t.Fatalf("1000 puts and %d evictions, want the first segments evicted", s.Stats().Evictions)
		}
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
	}
	if got, err := get(t, s, "k0", dst); err != nil || !bytes.Equal(got, fill(src, 1000, 8000).Bytes()) {
		t.Errorf("Get(k0), stored again after its first segment, = %v, want its second value", err)
	}
	held := int64(0)
	res := []store.Result{{}}
	for i := range 1000 {
		key := fmt.Sprintf("k%d", i)
		if err := s.Exists(bg, []string{key}, res); err != nil {
			t.Fatal(err)
		}
		_, err := get(t, s, key, dst)
		if (res[0].Err == nil) != (err == nil) {
			t.Errorf("%s: Exists says %v, Get %v", key, res[0].Err, err)
		}
		if err == nil {
			held++
		}
	}
	if st := s.Stats(); st.Keys != held {
		t.Errorf("Stats().Keys = %d, %d keys read back", st.Keys, held)
	}
	if _, err := get(t, s, "k1", dst); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(k1) from the first segment = %v, want store.ErrNotFound (evicted)", err)
	}
}
