package diskstore

import "os"

// SetWrite replaces the store's vectored write of segment files, to inject
// errors; nil restores the real one.
func SetWrite(s *Store, f func(f *os.File, bufs [][]byte, off int64) (int, error)) {
	if f == nil {
		f = writeFile
	}
	s.writev = f
}

// PutHeader writes a record's header and key, for tests that forge
// records.
func PutHeader(b []byte, kind byte, key string, size int, off int64, crc uint32) {
	putHeader(b, kind, key, size, off, crc)
}

// ValueOffset is valueOffset, for tests that forge records.
func ValueOffset(off int64, klen, size int) int64 { return valueOffset(off, klen, size) }

// InPageCache is inPageCache, for tests of the choice between the page
// cache and direct I/O.
func InPageCache(f *os.File, off, n int64) bool { return inPageCache(f, off, n) }

// WriteFile is the store's real vectored write of a segment.
var WriteFile = writeFile

// SetCloseHook sets a function that runs on the goroutine closing an
// evicted segment's files before they are closed.
func SetCloseHook(s *Store, f func()) { s.closeHook = f }

// WaitCloses waits for the closes of evicted segments running now.
func WaitCloses(s *Store) { s.waitCloses() }

// ValueLoc returns the segment file and offset of key's value, for
// benchmarks that read the store's layout without the store.
func ValueLoc(s *Store, key string) (path string, off int64, ok bool) {
	h1, h2 := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.mu.index[h1]
	if !ok || l.h2 != h2 {
		return "", 0, false
	}
	return s.mu.segs[l.seg].path, int64(l.off) + valueOffset(int64(l.off), len(key), int(l.size)), true
}
