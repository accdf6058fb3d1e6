//go:build linux

package diskstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// FuzzOpen opens a directory whose one segment file holds the fuzzed
// bytes, as a file damaged or written by another program would: Open
// neither fails nor panics, and every key the index holds reads back as
// a value that passes its checks, or store.ErrNotFound, never more bytes
// than its record has.
func FuzzOpen(f *testing.F) {
	// Seeds: a segment of real records, and pieces of it.
	dir := f.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 20, SegmentSize: 64 << 10})
	if err != nil {
		f.Skip(err)
	}
	mem, err := rdma.AllocHost(20 << 10)
	if err != nil {
		f.Skip(err)
	}
	defer mem.Free()
	res := make([]store.Result, 3)
	r := mem.Region()
	small, _ := r.Sub(0, 100)
	page, _ := r.Sub(0, 16<<10)
	if err := s.Put(context.Background(), []string{"a", "key-b", "c"}, []rdma.Region{small, page, small}, res); err != nil {
		f.Fatal(err)
	}
	s.Remove(context.Background(), "c")
	s.Close()
	seg, err := os.ReadFile(filepath.Join(dir, segName(0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seg)
	f.Add(seg[:200])
	f.Add(seg[:len(seg)-7])
	f.Add([]byte("KVD1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segName(0)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(Config{Dir: dir, Capacity: 1 << 20, SegmentSize: 64 << 10})
		if err != nil {
			t.Fatalf("Open of a damaged segment = %v, want it to skip what it cannot read", err)
		}
		defer s.Close()
		dst := mem.Region()
		s.mu.Lock()
		var locs []loc
		for _, l := range s.mu.index {
			locs = append(locs, l)
		}
		seg0 := s.mu.segs[0]
		s.mu.Unlock()
		for _, l := range locs {
			key, err := s.readKey(seg0, l)
			if err != nil {
				t.Fatalf("read the key of an indexed record: %v", err)
			}
			if int(l.size) > dst.Len {
				continue
			}
			res := []store.Result{{}}
			if err := s.Get(context.Background(), []string{key}, []rdma.Region{dst}, res); err != nil {
				t.Fatal(err)
			}
			switch {
			case errors.Is(res[0].Err, store.ErrNotFound):
			case res[0].Err != nil:
				t.Errorf("Get(%q) = %v, want a value or store.ErrNotFound", key, res[0].Err)
			case res[0].N != int(l.size):
				t.Errorf("Get(%q) = %d bytes, its record has %d", key, res[0].N, l.size)
			default:
				off := int64(l.off) + valueOffset(int64(l.off), len(key), int(l.size))
				if !bytes.Equal(dst.Bytes()[:res[0].N], data[off:off+int64(l.size)]) {
					t.Errorf("Get(%q) returned bytes other than its record's", key)
				}
			}
		}
	})
}
