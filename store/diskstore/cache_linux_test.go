//go:build linux

package diskstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
)

// dropCache writes the files of dir back and drops them from the page
// cache, so that the next reads of them go to the device.
func dropCache(t testing.TB, dir string) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		const fadvDontNeed = 4 // POSIX_FADV_DONTNEED
		if _, _, e := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0); e != 0 {
			t.Fatalf("fadvise %s: %v", p, e)
		}
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		held := st.Size() > 0 && diskstore.InPageCache(f, 0, st.Size())
		f.Close()
		if held {
			// tmpfs takes O_DIRECT but keeps its files in memory: there
			// is no device to read from.
			t.Skipf("the file system of %s keeps its files in the page cache (tmpfs?): no read goes to a device", dir)
		}
	}
}

// cachestatWorks reports whether the kernel tells what the page cache
// holds (cachestat, Linux 6.5): a file just written is held.
func cachestatWorks(t testing.TB) bool {
	f, err := os.Create(filepath.Join(t.TempDir(), "probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	return diskstore.InPageCache(f, 0, 64<<10)
}

// TestDirectReadsSkipCachedValues reads a value of whole pages into
// page-aligned memory twice: right after its put, from the page cache,
// which holds it (a direct read would write it back and read it from the
// device); once dropped from the page cache, with direct I/O.
func TestDirectReadsSkipCachedValues(t *testing.T) {
	dir := t.TempDir()
	s := open(t, diskstore.Config{Dir: dir, Capacity: 16 << 20})
	if !s.IO().Direct {
		t.Skip("the file system refuses O_DIRECT")
	}
	if !cachestatWorks(t) {
		t.Skip("the kernel has no cachestat (Linux 6.5): every such read is direct")
	}
	src, dst := buf(t, 64<<10), buf(t, 64<<10)
	put(t, s, "k", fill(src, 3, 64<<10))
	if got, err := get(t, s, "k", dst); err != nil || !bytes.Equal(got, src.Bytes()) {
		t.Fatalf("Get = %v, want the value", err)
	}
	if io := s.IO(); io.BufferedReads != 1 || io.DirectReads != 0 {
		t.Errorf("a Get of a value the page cache holds: IO() = %+v, want 1 buffered read, 0 direct", io)
	}
	dropCache(t, dir)
	clear(dst.Bytes())
	if got, err := get(t, s, "k", dst); err != nil || !bytes.Equal(got, src.Bytes()) {
		t.Fatalf("Get after dropping the page cache = %v, want the value", err)
	}
	if io := s.IO(); io.BufferedReads != 1 || io.DirectReads != 1 {
		t.Errorf("a Get of a value the page cache dropped: IO() = %+v, want 1 buffered read, 1 direct", io)
	}
}

// TestCorruptDirect damages records of whole pages, once stored, on disk
// where the page cache does not hold them: a Get with direct I/O reads
// the header and the value in one request from the page the record
// starts in (some start inside one), still catches a flipped byte in
// either, and serves the others whole.
func TestCorruptDirect(t *testing.T) {
	const size = 16 << 10
	dir := t.TempDir()
	s := open(t, diskstore.Config{Dir: dir, Capacity: 16 << 20})
	if !s.IO().Direct {
		t.Skip("the file system refuses O_DIRECT")
	}
	src, dst := buf(t, size), buf(t, size)
	for i := range 6 {
		if i == 3 { // the records after it start inside a page
			put(t, s, "small", fill(src, 9, 100))
		}
		put(t, s, fmt.Sprintf("key-%d", i), fill(src, i, size))
	}
	segs := segments(t, dir)
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(segs[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(at int) {
		b := []byte{data[at] ^ 0x10}
		if _, err := f.WriteAt(b, int64(at)); err != nil {
			t.Fatal(err)
		}
	}
	value1 := recordAt(t, data, "key-1")
	flip(int(diskstore.ValueOffset(int64(value1), 5, size)) + value1 + 1000) // in key-1's value
	flip(recordAt(t, data, "key-4") + 33)                                    // in key-4's key
	f.Close()
	dropCache(t, dir)
	for i := range 6 {
		key := fmt.Sprintf("key-%d", i)
		got, err := get(t, s, key, dst)
		if i == 1 || i == 4 {
			if !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), ".seg at offset") {
				t.Errorf("Get(%q) of a damaged record = %v, want store.ErrNotFound naming the file and offset", key, err)
			}
			continue
		}
		if want := fill(src, i, size).Bytes(); err != nil || !bytes.Equal(got, want) {
			t.Errorf("Get(%q) = %v, want its value whole", key, err)
		}
	}
	if io := s.IO(); io.Corrupt != 2 || io.DirectReads != 6 || io.BufferedReads != 0 {
		t.Errorf("IO() = %+v, want 2 corrupt, 6 direct reads, 0 buffered", io)
	}
}
