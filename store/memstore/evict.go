package memstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"

	"github.com/kvconnect/kvconnect/store"
)

// maxEvictWaits bounds how many eviction rounds run by other puts a put
// waits for before it gives up with store.ErrNoSpace.
const maxEvictWaits = 4

// allocate returns an arena extent of at least size bytes and its offset.
// While the memory in use stays under the high watermark it takes free
// memory; otherwise it evicts least recently used entries first. It fails
// with store.ErrNoSpace when even after its own eviction round no free
// extent is large enough.
func (s *Store) allocate(key string, size int64) (int32, int64, error) {
	if size > s.cfg.Capacity {
		return nilNode, 0, fmt.Errorf("%w: put %.64q: value of %d bytes is larger than the capacity, %d bytes", store.ErrNoSpace, key, size, s.cfg.Capacity)
	}
	if size > maxSize { // the index's records hold 48-bit sizes
		return nilNode, 0, fmt.Errorf("%w: put %.64q: value of %d bytes is larger than %d bytes", store.ErrNoSpace, key, size, int64(maxSize))
	}
	units := unitsFor(size)
	underMark := true
	for range maxEvictWaits {
		if node, off, ok := s.tryAlloc(units, underMark); ok {
			return node, off, nil
		}
		underMark = false
		if s.evictRound(units) {
			if node, off, ok := s.tryAlloc(units, false); ok {
				return node, off, nil
			}
			break
		}
	}
	s.alloc.Lock()
	used, units0 := s.alloc.a.used, s.alloc.a.units
	count, largest := s.alloc.a.freeStats()
	s.alloc.Unlock()
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("memstore: put refused", "key", key, "size", size, "used", used<<unitShift, "capacity", units0<<unitShift, "free extents", count, "largest free", largest<<unitShift)
	}
	return nilNode, 0, fmt.Errorf("%w: put %.64q: no room for %d bytes (%d of %d bytes in use, largest free extent %d bytes, the rest is being read)",
		store.ErrNoSpace, key, size, used<<unitShift, units0<<unitShift, largest<<unitShift)
}

// tryAlloc allocates units units, if underMark only while the memory in
// use stays at or under the high watermark.
func (s *Store) tryAlloc(units int64, underMark bool) (int32, int64, bool) {
	s.alloc.Lock()
	defer s.alloc.Unlock()
	a := s.alloc.a
	if underMark && a.used+units > s.highUnits {
		return nilNode, 0, false
	}
	node := a.alloc(units)
	if node == nilNode {
		return nilNode, 0, false
	}
	return node, a.offset(node), true
}

func isNoSpace(err error) bool { return errors.Is(err, store.ErrNoSpace) }

// evictRound frees the least recently used entries that no Get is copying
// out of, EvictRatio of the capacity or, if more, as much as it takes for
// a put of units units to stay under the high watermark; or all of them if
// there are fewer. Rounds are serialised: a caller that waited for
// another caller's round returns false without evicting, so that it tries
// that room first; otherwise it returns true.
//
// The order is approximately LRU across shards: each shard's LRU list is
// exact, and the round repeatedly evicts from the shard whose oldest
// evictable entry is the oldest, by the stamps of the store-wide clock.
func (s *Store) evictRound(units int64) bool {
	gen := s.evict.gen.Load()
	s.evict.Lock()
	defer s.evict.Unlock()
	if s.evict.gen.Load() != gen {
		return false
	}
	defer s.evict.gen.Add(1)

	s.alloc.Lock()
	over := s.alloc.a.used + units - s.highUnits // what the put takes above the watermark
	s.alloc.Unlock()
	target := max(s.evictUnits, over)
	cur := s.evict.cursor
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		cur[i] = math.MaxUint64
		if id := sh.oldestEvictable(); id != 0 {
			cur[i] = sh.ix.ents[id].stamp
		}
		sh.mu.Unlock()
	}
	var freed, keys int64
	for freed < target {
		best, second := -1, uint64(math.MaxUint64)
		for i, c := range cur {
			switch {
			case best < 0 || c < cur[best]:
				if best >= 0 {
					second = cur[best]
				}
				best = i
			case c < second:
				second = c
			}
		}
		if cur[best] == math.MaxUint64 {
			break // nothing left to evict
		}
		sh := &s.shards[best]
		nodes := s.evict.nodes[:0]
		sh.mu.Lock()
		for freed < target {
			id := sh.oldestEvictable()
			if id == 0 {
				cur[best] = math.MaxUint64
				break
			}
			e := &sh.ix.ents[id]
			if e.stamp > second {
				cur[best] = e.stamp // another shard now holds the oldest entry
				break
			}
			freed += unitsFor(int64(sh.ix.size(id)))
			keys++
			nodes = append(nodes, e.node)
			// Eviction drops the key here.
			s.announce(sh, id, store.KeyEvicted)
			sh.unindex(id, s.hash(sh.ix.key(e)))
			sh.ix.release(id)
		}
		sh.mu.Unlock()
		s.alloc.Lock()
		for _, n := range nodes {
			s.alloc.a.free(n)
		}
		s.alloc.Unlock()
		s.evict.nodes = nodes
	}
	s.counters.evictions.Add(keys)
	if s.log.Enabled(context.Background(), slog.LevelDebug) { // no boxing of the arguments otherwise
		s.log.Debug("memstore: evicted", "keys", keys, "bytes", freed<<unitShift, "wanted", target<<unitShift)
	}
	return true
}
