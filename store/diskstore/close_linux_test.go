package diskstore_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
)

// openIn lists the files of dir (deleted ones included) that this
// process holds open.
func openIn(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	var held []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			held = append(held, target)
		}
	}
	return held
}

// TestEvictedFilesClosed evicts segments (whose files are closed on a
// goroutine of their own, off the put that evicted them) and checks that
// once Close returned no file of the directory is held open: not the
// live segments, not the evicted ones, not the lock.
func TestEvictedFilesClosed(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	src := buf(t, 8192)
	for i := range 300 {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
	}
	if st := s.Stats(); st.Evictions < 200 {
		t.Fatalf("Stats().Evictions = %d after 300 puts of 8000 bytes into 512 KiB, want most of them evicted", st.Evictions)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if held := openIn(t, cfg.Dir); len(held) > 0 {
		t.Errorf("after Close the process still holds %d files of the directory open: %q", len(held), held)
	}
}

// TestFullDiskWaitsForCloses: the blocks of an evicted segment are freed
// when its file is closed, which runs beside the put whose roll evicted
// it. A put whose write finds the disk full while such a close runs waits
// for it and writes again, instead of failing with store.ErrNoSpace. The
// write (injected) fails with ENOSPC after the roll until the evicted
// segment's close has ended.
func TestFullDiskWaitsForCloses(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	defer s.Close()
	src := buf(t, 8192)
	i := 0
	for ; s.Stats().Evictions == 0; i++ {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
	}
	var full atomic.Bool
	seen := make(chan struct{}) // closed by the write that found the disk full
	var seenOnce sync.Once
	evicted := s.Stats().Evictions
	diskstore.SetWrite(s, func(f *os.File, bufs [][]byte, off int64) (int, error) {
		if full.Load() && s.Stats().Evictions > evicted {
			seenOnce.Do(func() { close(seen) })
			return 0, syscall.ENOSPC
		}
		return diskstore.WriteFile(f, bufs, off)
	})
	diskstore.SetCloseHook(s, func() {
		if !full.Load() {
			return
		}
		select {
		case <-seen:
		case <-time.After(time.Minute):
			t.Errorf("no write found the disk full within a minute of a segment's eviction")
		}
		full.Store(false) // the close freed the segment's blocks
	})
	full.Store(true)
	for first := i; s.Stats().Evictions == evicted; i++ {
		if i-first > 100 {
			t.Fatalf("100 puts of 8000 bytes into 64 KiB segments evicted nothing")
		}
		key := fmt.Sprintf("k%d", i)
		res := []store.Result{{}}
		if err := s.Put(bg, []string{key}, []rdma.Region{fill(src, i, 8000)}, res); err != nil || res[0].Err != nil {
			t.Fatalf("Put(%s), whose roll evicted a segment while the disk was full until its close: %v, %v; want it to wait for the close and succeed", key, err, res[0].Err)
		}
	}
	select {
	case <-seen:
	default:
		t.Fatalf("no write found the disk full: the test did not test")
	}
	dst := buf(t, 8192)
	last := i - 1
	if got, err := get(t, s, fmt.Sprintf("k%d", last), dst); err != nil || !bytes.Equal(got, fill(src, last, 8000).Bytes()) {
		t.Errorf("Get(k%d) after the put that waited = %v, want its value whole", last, err)
	}
}
