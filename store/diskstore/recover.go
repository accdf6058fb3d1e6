package diskstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvconnect/kvconnect/store"
)

// scanWindow is how many bytes of a segment file Open reads at a time.
const scanWindow = 1 << 20

// recover rebuilds the index from the segment files of the directory, in
// id order, and leaves the last one's successor as the next id. Records
// are read header by header; values are not read (a Get checks them). A
// stretch that does not parse (a torn tail, damaged bytes) is skipped up
// to the next record that does, counted and logged.
func (s *Store) recover() error {
	ids, err := sortedSegments(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("diskstore: open: %w", err)
	}
	for _, id := range ids {
		path := filepath.Join(s.cfg.Dir, segName(id))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("diskstore: open: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("diskstore: open: %w", err)
		}
		seg := &segment{id: id, path: path, f: f, end: fi.Size()}
		s.mu.segs[id] = seg
		s.mu.order = append(s.mu.order, seg)
		s.mu.used += seg.end
		s.mu.nextID = id + 1
		if err := s.scan(seg); err != nil {
			return err
		}
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

// scan adds the records of seg to the index.
func (s *Store) scan(seg *segment) error {
	size := seg.end
	win := make([]byte, scanWindow)
	winOff, winLen := int64(0), 0 // the window holds [winOff, winOff+winLen)
	badFrom := int64(-1)          // start of the damaged stretch being skipped
	for off := int64(0); off+headerSize <= size; {
		need := min(int64(headerSize+store.MaxKeyLen), size-off)
		if off < winOff || off+need > winOff+int64(winLen) {
			n := int(min(int64(len(win)), size-off))
			if _, err := vecIO(false, seg.f, [][]byte{win[:n]}, off); err != nil && !errors.Is(err, errShort) {
				return fmt.Errorf("diskstore: open: read %s at offset %d: %w", seg.path, off, err)
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
		switch h.kind {
		case kindValue:
			h1, h2 := s.hashBytes(key)
			if _, ok := s.mu.index[h1]; !ok {
				s.mu.index[h1] = loc{seg: seg.id, off: uint32(off), size: uint32(h.size), h2: h2, klen: uint16(h.klen)}
				s.mu.keys++
				s.mu.bytes += h.size
			}
		case kindTombstone:
			h1, h2 := s.hashBytes(key)
			if l, ok := s.mu.index[h1]; ok && l.h2 == h2 {
				delete(s.mu.index, h1)
				s.mu.keys--
				s.mu.bytes -= int64(l.size)
			}
		case kindClear:
			clear(s.mu.index)
			s.mu.keys, s.mu.bytes = 0, 0
			s.mu.clearAt = pos{seg.id, uint32(off)}
		}
		off = recordEnd(off, h.klen, int(h.size))
	}
	if badFrom >= 0 {
		s.skip(size - badFrom)
	}
	return nil
}

func (s *Store) skip(n int64) {
	s.counters.skipped.Add(1)
	s.counters.skippedBytes.Add(n)
}
