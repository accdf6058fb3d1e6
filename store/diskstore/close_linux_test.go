package diskstore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
