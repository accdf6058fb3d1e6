package diskstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/kvconnect/kvconnect/store"
)

// scanWindow is how many bytes of a segment file Open reads at a time.
const scanWindow = 4 << 20

// scanned is one record a scan found: its index key and where it is. A
// tombstone has kind kindTombstone, a clear kindClear (and no key).
type scanned struct {
	h1   uint64
	l    loc
	kind byte
}

// recover rebuilds the index from the segment files of the directory and
// leaves the last one's successor as the next id. The segments are
// scanned in parallel, GOMAXPROCS at a time, header by header (values are
// not read: a Get checks them); their records then enter the index in id
// and offset order, so that the index is the one a scan in order would
// build. A stretch that does not parse (a torn tail, damaged bytes) is
// skipped up to the next record that does, counted and logged.
func (s *Store) recover() error {
	ids, err := sortedSegments(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("diskstore: open: %w", err)
	}
	segs := make([]*segment, 0, len(ids))
	for _, id := range ids {
		path := filepath.Join(s.cfg.Dir, segName(id))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("diskstore: open: %w", err)
		}
		seg := &segment{id: id, path: path, f: f}
		// Registered first, so that closeFiles closes it on any error.
		s.mu.segs[id] = seg
		s.mu.order = append(s.mu.order, seg)
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("diskstore: open: %w", err)
		}
		seg.end = fi.Size()
		s.mu.used += seg.end
		s.mu.nextID = id + 1
		segs = append(segs, seg)
	}

	recs := make([]scannedList, len(segs))
	errs := make([]error, len(segs))
	next := make(chan int, len(segs))
	for i := range segs {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(segs)) {
		wg.Go(func() {
			for i := range next {
				recs[i], errs[i] = s.scan(segs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	values := 0
	for _, rs := range recs {
		values += rs.values
	}
	s.mu.index = make(map[uint64]loc, values)
	for i, seg := range segs {
		s.index(seg, recs[i])
		recs[i] = scannedList{} // garbage as soon as indexed
	}
	if n := len(s.mu.order); n > 0 {
		// roll, which Open calls next, takes the last segment for the
		// active one, whose whole SegmentSize counts as used.
		s.mu.used += s.cfg.SegmentSize - s.mu.order[n-1].end
	}
	if s.direct {
		for _, seg := range s.mu.order {
			seg.df, _ = openDirect(seg.path)
		}
	}
	return nil
}

// index enters the records that scan found in seg into the index: a key
// keeps its first value, a tombstone removes it, a clear removes every
// key before it.
func (s *Store) index(seg *segment, recs scannedList) {
	seg.keys = make([]uint64, 0, recs.values)
	for r := range recs.all {
		switch r.kind {
		case kindValue:
			if _, ok := s.mu.index[r.h1]; !ok {
				s.mu.index[r.h1] = r.l
				seg.keys = append(seg.keys, r.h1)
				s.mu.keys++
				s.mu.bytes += int64(r.l.size)
			}
		case kindTombstone:
			if l, ok := s.mu.index[r.h1]; ok && l.h2 == r.l.h2 {
				delete(s.mu.index, r.h1)
				s.mu.keys--
				s.mu.bytes -= int64(l.size)
			}
		case kindClear:
			clear(s.mu.index)
			s.mu.keys, s.mu.bytes = 0, 0
			s.mu.clearAt = r.l.pos()
		}
	}
}

// scan reads the records of seg. It may run beside scans of other
// segments.
func (s *Store) scan(seg *segment) (scannedList, error) {
	size := seg.end
	var recs scannedList
	win := make([]byte, min(scanWindow, size))
	winOff, winLen := int64(0), 0 // the window holds [winOff, winOff+winLen)
	badFrom := int64(-1)          // start of the damaged stretch being skipped
	for off := int64(0); off+headerSize <= size; {
		need := min(int64(headerSize+store.MaxKeyLen), size-off)
		if off < winOff || off+need > winOff+int64(winLen) {
			n := int(min(int64(len(win)), size-off))
			if _, err := vecIO(false, seg.f, [][]byte{win[:n]}, off); err != nil && !errors.Is(err, errShort) {
				return recs, fmt.Errorf("diskstore: open: read %s at offset %d: %w", seg.path, off, err)
			}
			winOff, winLen = off, n
		}
		b := win[off-winOff : winLen]
		h, key, err := parseHeader(b, off, size)
		if err != nil {
			if badFrom < 0 {
				badFrom = off
				s.log.Warn("diskstore: skipping damaged records", "file", seg.path, "offset", off, "err", err)
			}
			off += recAlign
			continue
		}
		if badFrom >= 0 {
			s.skip(off - badFrom)
			badFrom = -1
		}
		r := scanned{kind: h.kind, l: loc{seg: seg.id, off: uint32(off)}}
		if h.kind != kindClear {
			r.h1, r.l.h2 = s.hashBytes(key)
			r.l.size, r.l.klen = uint32(h.size), uint16(h.klen)
		}
		recs.add(r)
		off = recordEnd(off, h.klen, int(h.size))
	}
	if badFrom >= 0 {
		s.skip(size - badFrom)
	}
	return recs, nil
}

// scannedList is the records of a segment in file order, in chunks: a
// segment may hold millions, which one slice would copy as it grows.
type scannedList struct {
	chunks    [][]scanned
	n, values int
}

const scannedChunk = 8192

func (l *scannedList) add(r scanned) {
	if k := len(l.chunks); k == 0 || len(l.chunks[k-1]) == scannedChunk {
		l.chunks = append(l.chunks, make([]scanned, 0, scannedChunk))
	}
	k := len(l.chunks) - 1
	l.chunks[k] = append(l.chunks[k], r)
	l.n++
	if r.kind == kindValue {
		l.values++
	}
}

// all yields the records in order.
func (l *scannedList) all(yield func(scanned) bool) {
	for _, c := range l.chunks {
		for _, r := range c {
			if !yield(r) {
				return
			}
		}
	}
}

func (s *Store) skip(n int64) {
	s.counters.skipped.Add(1)
	s.counters.skippedBytes.Add(n)
}
