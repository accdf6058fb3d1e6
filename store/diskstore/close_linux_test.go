package diskstore_test

import (
	"bytes"
	"errors"
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

// TestEvictedFilesClosed: the files of evicted segments are closed on a
// goroutine of their own, not in the put that evicted them, and Close
// waits for those closes. A hook holds every close until released: the
// puts that evict must return meanwhile, Close must not, and once it
// returns no file of the directory (live segment, evicted one, lock) is
// held open.
func TestEvictedFilesClosed(t *testing.T) {
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	release := make(chan struct{})
	var held atomic.Int64
	diskstore.SetCloseHook(s, func() {
		held.Add(1)
		<-release
	})
	src := buf(t, 8192)
	puts := make(chan error, 1)
	go func() {
		for i := range 300 {
			res := []store.Result{{}}
			if err := s.Put(bg, []string{fmt.Sprintf("k%d", i)}, []rdma.Region{fill(src, i, 8000)}, res); err != nil || res[0].Err != nil {
				puts <- fmt.Errorf("Put(k%d): %v, %v", i, err, res[0].Err)
				return
			}
		}
		puts <- nil
	}()
	select {
	case err := <-puts:
		if err != nil {
			close(release)
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatalf("300 puts did not end within a minute while the closes of evicted segments were held: a put waits for the close of what it evicted")
	}
	if st := s.Stats(); st.Evictions < 200 || held.Load() == 0 {
		close(release)
		t.Fatalf("Stats().Evictions = %d, closes held %d, after 300 puts of 8000 bytes into 512 KiB: want most values evicted and their closes held", st.Evictions, held.Load())
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		close(release)
		t.Fatalf("Close returned (%v) while %d closes of evicted segments were held, want it to wait for them", err, held.Load())
	case <-time.After(100 * time.Millisecond): // a wrong Close returns at once
	}
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Close did not return within a minute of the closes' release")
	}
	if open := openIn(t, cfg.Dir); len(open) > 0 {
		t.Errorf("after Close the process still holds %d files of the directory open: %q", len(open), open)
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
		full.Store(false) // the close frees the segment's blocks
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

// fullAfterRoll fills a store of 64 KiB segments until it evicts, then
// replaces its writes with w and puts values until one put's roll evicts
// again; it returns that put's error. The closes of evicted segments are
// held (by a close hook) until the first write after that roll began, so
// that the put's write always finds the evicted segment's close running
// or ended since it began, whatever the goroutines' timing.
func fullAfterRoll(t *testing.T, w func(s *diskstore.Store, f *os.File, bufs [][]byte, off int64, evicted bool) (int, error)) error {
	t.Helper()
	cfg := diskstore.Config{Dir: t.TempDir(), Capacity: 512 << 10, SegmentSize: 64 << 10}
	s := open(t, cfg)
	t.Cleanup(func() { s.Close() })
	src := buf(t, 8192)
	i := 0
	for ; s.Stats().Evictions == 0; i++ {
		put(t, s, fmt.Sprintf("k%d", i), fill(src, i, 8000))
	}
	before := s.Stats().Evictions
	writing := make(chan struct{})
	var once sync.Once
	diskstore.SetCloseHook(s, func() {
		select {
		case <-writing:
		case <-time.After(time.Minute):
			t.Errorf("no write after the roll within a minute")
		}
	})
	diskstore.SetWrite(s, func(f *os.File, bufs [][]byte, off int64) (int, error) {
		evicted := s.Stats().Evictions > before
		if evicted {
			once.Do(func() { close(writing) })
		}
		return w(s, f, bufs, off, evicted)
	})
	for first := i; ; i++ {
		if i-first > 100 {
			t.Fatalf("100 puts of 8000 bytes into 64 KiB segments evicted nothing")
		}
		res := []store.Result{{}}
		if err := s.Put(bg, []string{fmt.Sprintf("k%d", i)}, []rdma.Region{fill(src, i, 8000)}, res); err != nil {
			t.Fatal(err)
		}
		if s.Stats().Evictions > before {
			return res[0].Err
		}
		if res[0].Err != nil {
			t.Fatalf("Put(k%d) before the roll: %v", i, res[0].Err)
		}
	}
}

// TestFullDiskCloseEndedDuringWrite: the close of the evicted segment
// ends between the write that found the disk full and the put's look at
// the closes running: the put still writes again, and succeeds.
func TestFullDiskCloseEndedDuringWrite(t *testing.T) {
	failed := false
	err := fullAfterRoll(t, func(s *diskstore.Store, f *os.File, bufs [][]byte, off int64, evicted bool) (int, error) {
		if evicted && !failed {
			failed = true
			diskstore.WaitCloses(s) // the close ends before this write reports
			return 0, syscall.ENOSPC
		}
		return diskstore.WriteFile(f, bufs, off)
	})
	if !failed {
		t.Fatalf("no write found the disk full: the test did not test")
	}
	if err != nil {
		t.Errorf("the put whose write found the disk full while the close of the segment it evicted ended: %v, want it to write again and succeed", err)
	}
}

// TestFullDiskStaysFull: a disk still full once the closes ended fails
// the put with store.ErrNoSpace after one more write, not more.
func TestFullDiskStaysFull(t *testing.T) {
	var writes atomic.Int64
	err := fullAfterRoll(t, func(s *diskstore.Store, f *os.File, bufs [][]byte, off int64, evicted bool) (int, error) {
		if evicted {
			writes.Add(1)
			return 0, syscall.ENOSPC
		}
		return diskstore.WriteFile(f, bufs, off)
	})
	if !errors.Is(err, store.ErrNoSpace) {
		t.Errorf("the put on a disk that stays full: %v, want store.ErrNoSpace", err)
	}
	if n := writes.Load(); n != 2 {
		t.Errorf("the put wrote %d times on a full disk, want 2 (once more after the closes)", n)
	}
}
