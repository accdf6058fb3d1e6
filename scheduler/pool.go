package scheduler

import (
	"fmt"
	"math"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// BlockID is the index of a block in the engine's paged KV memory; the same
// type the connector uses.
type BlockID = connector.BlockID

// maxBlocks is the largest pool: block ids are int32 and the LRU links use
// -1 as the end marker.
const maxBlocks = math.MaxInt32

// Where a block is, besides its reference count.
const (
	blockFree   uint8 = iota // no reference, no content: on the free stack
	blockCached              // no reference, indexed content: on the LRU list
	blockUsed                // referenced by at least one holder
)

// poolKey indexes the prefix cache: an interned namespace and a block hash.
type poolKey struct {
	ns uint32
	h  hashing.BlockHash
}

// Pool is a paged block pool with reference counts and a local prefix
// cache.
//
// Every block is in exactly one of three sets: free (no reference, no
// content worth keeping), used (one or more references: a request computing
// into it, requests sharing it as a cached prefix, a transfer the
// connector keeps it for) or cached (no reference, but its content is
// indexed under (namespace, block hash), so a later request with that
// prefix can take it back). Allocate hands out free blocks first, then
// evicts cached ones, least recently released first. A used block is never
// handed out.
//
// The index is keyed by namespace as well as hash: a lookup in a namespace
// never finds a block committed in another one (another tenant or model, an
// older weights generation). [Pool.InvalidateAll] drops the whole index
// after a weight update.
//
// The Pool is deterministic: the same calls give the same blocks. It does
// not allocate in steady state, except when the index map grows. A Pool is
// not safe for concurrent use.
type Pool struct {
	ref   []int32
	where []uint8
	key   []poolKey // the block's key while indexed[b]
	index []bool    // the block's content is in the index
	prev  []int32   // LRU links of cached blocks, -1 at the ends
	next  []int32
	head  int32 // least recently released cached block, -1 if none
	tail  int32 // most recently released cached block, -1 if none
	free  []BlockID
	cache map[poolKey]BlockID
	nss   [][32]byte // interned namespace digests; poolKey.ns indexes it

	used, cached int
	stats        PoolStats
}

// PoolStats are a pool's occupancy and counters. Free+Used+Cached = Blocks.
type PoolStats struct {
	Blocks int // blocks in the pool
	Free   int // unreferenced blocks without indexed content
	Used   int // referenced blocks
	Cached int // unreferenced blocks whose content is indexed
	// Indexed is the number of entries of the prefix-cache index, used or
	// cached.
	Indexed int

	Allocated     int64 // blocks handed out by Allocate
	Evicted       int64 // cached blocks Allocate reclaimed
	LookupBlocks  int64 // blocks Lookup was asked for
	HitBlocks     int64 // blocks Lookup found
	Committed     int64 // blocks Commit indexed
	Invalidations int64 // InvalidateAll calls
}

// add adds o's occupancy and counters to s.
func (s *PoolStats) add(o PoolStats) {
	s.Blocks += o.Blocks
	s.Free += o.Free
	s.Used += o.Used
	s.Cached += o.Cached
	s.Indexed += o.Indexed
	s.Allocated += o.Allocated
	s.Evicted += o.Evicted
	s.LookupBlocks += o.LookupBlocks
	s.HitBlocks += o.HitBlocks
	s.Committed += o.Committed
	s.Invalidations += o.Invalidations
}

// NewPool returns a pool of n free blocks, ids 0 to n-1. Allocate hands
// them out lowest id first.
func NewPool(n int) (*Pool, error) {
	if n <= 0 || n > maxBlocks {
		return nil, fmt.Errorf("%w: pool of %d blocks, want 1 to %d", ErrConfig, n, maxBlocks)
	}
	p := &Pool{
		ref:   make([]int32, n),
		where: make([]uint8, n),
		key:   make([]poolKey, n),
		index: make([]bool, n),
		prev:  make([]int32, n),
		next:  make([]int32, n),
		head:  -1,
		tail:  -1,
		free:  make([]BlockID, n),
		cache: make(map[poolKey]BlockID),
	}
	for i := range n {
		p.free[i] = BlockID(n - 1 - i) // a stack: block 0 on top
		p.prev[i], p.next[i] = -1, -1
	}
	p.stats.Blocks = n
	return p, nil
}

// Len returns the number of blocks in the pool.
func (p *Pool) Len() int { return len(p.ref) }

// Available returns how many blocks Allocate can hand out now: free plus
// cached ones.
func (p *Pool) Available() int { return len(p.free) + p.cached }

// Refs returns the reference count of b, or -1 if b is outside the pool.
func (p *Pool) Refs(b BlockID) int {
	if b < 0 || int(b) >= len(p.ref) {
		return -1
	}
	return int(p.ref[b])
}

// Stats returns the pool's occupancy and counters.
func (p *Pool) Stats() PoolStats {
	s := p.stats
	s.Free, s.Used, s.Cached, s.Indexed = len(p.free), p.used, p.cached, len(p.cache)
	return s
}

func (p *Pool) check(b BlockID) error {
	if b < 0 || int(b) >= len(p.ref) {
		return fmt.Errorf("%w: block %d outside [0, %d)", ErrInvalidBlock, b, len(p.ref))
	}
	return nil
}

// Allocate appends n blocks to dst, each with one reference, and returns
// it. Free blocks go first, then cached blocks, least recently released
// first; their index entries are dropped. If fewer than n blocks are
// available it returns dst unchanged and an error wrapping [ErrNoBlocks].
func (p *Pool) Allocate(dst []BlockID, n int) ([]BlockID, error) {
	if n < 0 {
		return dst, fmt.Errorf("%w: Allocate(%d blocks)", ErrInvalidBlock, n)
	}
	if n > p.Available() {
		return dst, fmt.Errorf("%w: want %d, %d available (%d free, %d cached) of %d", ErrNoBlocks, n, p.Available(), len(p.free), p.cached, len(p.ref))
	}
	for range n {
		var b BlockID
		if k := len(p.free); k > 0 {
			b = p.free[k-1]
			p.free = p.free[:k-1]
		} else {
			b = BlockID(p.head)
			p.unlink(b)
			p.cached--
			p.unindex(b)
			p.stats.Evicted++
		}
		p.ref[b] = 1
		p.where[b] = blockUsed
		p.used++
		dst = append(dst, b)
	}
	p.stats.Allocated += int64(n)
	return dst, nil
}

// Ref takes one more reference on b: a block in use (another holder shares
// it) or a cached block (a prefix-cache hit takes it back from the LRU
// list). A free block cannot be referenced: its content is not worth
// keeping, so whoever wants it must Allocate it.
func (p *Pool) Ref(b BlockID) error {
	if err := p.check(b); err != nil {
		return err
	}
	switch p.where[b] {
	case blockFree:
		return fmt.Errorf("%w: Ref(%d): the block is free", ErrInvalidBlock, b)
	case blockCached:
		p.unlink(b)
		p.cached--
		p.used++
		p.where[b] = blockUsed
	}
	p.ref[b]++
	return nil
}

// Release drops one reference on each block of blocks (a block listed
// twice loses two). A block whose last reference goes becomes cached if its
// content is indexed, free otherwise. Blocks are released last first, so
// that of one request's blocks its tail is evicted before its head, which
// more requests share. If any block is outside the pool or would go below
// zero references, nothing is released and the error names the block.
func (p *Pool) Release(blocks []BlockID) error {
	for i, b := range blocks {
		err := p.check(b)
		if err == nil && p.ref[b] == 0 {
			err = fmt.Errorf("%w: Release(%d): the block has no reference", ErrInvalidBlock, b)
		}
		if err != nil {
			for _, u := range blocks[:i] {
				p.ref[u]++
			}
			return err
		}
		p.ref[b]--
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if p.ref[b] != 0 || p.where[b] != blockUsed {
			continue
		}
		p.used--
		if p.index[b] {
			p.where[b] = blockCached
			p.cached++
			p.pushLRU(b)
		} else {
			p.where[b] = blockFree
			p.free = append(p.free, b)
		}
	}
	return nil
}

// Lookup appends to dst the blocks that hold the longest prefix of hashes
// in namespace ns, and returns it: dst gains Blocks[i] for hashes[i] until
// the first hash the cache lacks. It takes no reference and changes no
// LRU order: Ref each block to keep it.
func (p *Pool) Lookup(ns hashing.Namespace, hashes []hashing.BlockHash, dst []BlockID) []BlockID {
	p.stats.LookupBlocks += int64(len(hashes))
	id, ok := p.findNS(ns)
	if !ok {
		return dst
	}
	n := len(dst)
	for _, h := range hashes {
		b, ok := p.cache[poolKey{id, h}]
		if !ok {
			break
		}
		dst = append(dst, b)
	}
	p.stats.HitBlocks += int64(len(dst) - n)
	return dst
}

// find returns the block indexed for h in namespace ns, without counting
// a lookup.
func (p *Pool) find(ns hashing.Namespace, h hashing.BlockHash) (BlockID, bool) {
	id, ok := p.findNS(ns)
	if !ok {
		return connector.NoBlock, false
	}
	b, ok := p.cache[poolKey{id, h}]
	if !ok {
		return connector.NoBlock, false
	}
	return b, true
}

// Commit records that b, which must be referenced, holds the KV of the
// block with hash h in namespace ns, so that Lookup finds it. It reports
// whether b is now the block indexed for h: false when another block
// already holds that content (b then stays unindexed and is freed, not
// cached, on its last release). Committing b again under the same key is a
// no-op; under another key it is an error, as is a free or cached block.
func (p *Pool) Commit(b BlockID, ns hashing.Namespace, h hashing.BlockHash) (bool, error) {
	if err := p.check(b); err != nil {
		return false, err
	}
	if p.where[b] != blockUsed {
		return false, fmt.Errorf("%w: Commit(%d): the block has no reference", ErrInvalidBlock, b)
	}
	k := poolKey{p.internNS(ns), h}
	if p.index[b] {
		if p.key[b] == k {
			return true, nil
		}
		return false, fmt.Errorf("%w: Commit(%d, %v): the block is indexed under %v", ErrInvalidBlock, b, h, p.key[b].h)
	}
	if _, dup := p.cache[k]; dup {
		return false, nil
	}
	p.cache[k] = b
	p.key[b] = k
	p.index[b] = true
	p.stats.Committed++
	return true, nil
}

// InvalidateAll drops every entry of the prefix cache, in every namespace:
// cached blocks become free, and blocks in use stay with their holders but
// are freed, not cached, on their last release. Engines call it after a
// weight update, when no stored KV is valid any more.
func (p *Pool) InvalidateAll() {
	for b := p.head; b >= 0; {
		next := p.next[b]
		p.prev[b], p.next[b] = -1, -1
		p.where[b] = blockFree
		p.free = append(p.free, BlockID(b))
		b = next
	}
	p.head, p.tail = -1, -1
	p.cached = 0
	for _, b := range p.cache {
		p.index[b] = false
		p.key[b] = poolKey{}
	}
	clear(p.cache)
	p.nss = p.nss[:0]
	p.stats.Invalidations++
}

// Check verifies the pool's internal consistency and returns an error
// describing the first violation: the sets do not add up, a reference count
// disagrees with the block's set, the LRU list or the index is broken. It
// costs O(blocks); tests and debugging call it.
func (p *Pool) Check() error {
	n := len(p.ref)
	if len(p.free)+p.used+p.cached != n {
		return fmt.Errorf("scheduler: pool: free %d + used %d + cached %d != %d blocks", len(p.free), p.used, p.cached, n)
	}
	var free, used, cached, indexed int
	for b := range n {
		switch {
		case p.ref[b] < 0:
			return fmt.Errorf("scheduler: pool: block %d has %d references", b, p.ref[b])
		case p.ref[b] > 0 && p.where[b] != blockUsed, p.ref[b] == 0 && p.where[b] == blockUsed:
			return fmt.Errorf("scheduler: pool: block %d has %d references in set %d", b, p.ref[b], p.where[b])
		case p.where[b] == blockCached && !p.index[b]:
			return fmt.Errorf("scheduler: pool: block %d is cached but not indexed", b)
		case p.where[b] == blockFree && p.index[b]:
			return fmt.Errorf("scheduler: pool: block %d is free but indexed", b)
		}
		switch p.where[b] {
		case blockFree:
			free++
		case blockUsed:
			used++
		case blockCached:
			cached++
		}
		if p.index[b] {
			indexed++
			if got, ok := p.cache[p.key[b]]; !ok || got != BlockID(b) {
				return fmt.Errorf("scheduler: pool: block %d is indexed but the index maps its key to %d (present %v)", b, got, ok)
			}
		}
	}
	if free != len(p.free) || used != p.used || cached != p.cached {
		return fmt.Errorf("scheduler: pool: counted free %d used %d cached %d, recorded %d %d %d", free, used, cached, len(p.free), p.used, p.cached)
	}
	if indexed != len(p.cache) {
		return fmt.Errorf("scheduler: pool: %d blocks indexed, index has %d entries", indexed, len(p.cache))
	}
	seen := make([]bool, n)
	for _, b := range p.free {
		if p.where[b] != blockFree || seen[b] {
			return fmt.Errorf("scheduler: pool: block %d on the free stack twice or not free", b)
		}
		seen[b] = true
	}
	k := 0
	for b, prev := p.head, int32(-1); b >= 0; prev, b = b, p.next[b] {
		if p.where[b] != blockCached || p.prev[b] != prev || k > n {
			return fmt.Errorf("scheduler: pool: LRU list broken at block %d", b)
		}
		k++
		if p.next[b] < 0 && p.tail != b {
			return fmt.Errorf("scheduler: pool: LRU list ends at %d, tail is %d", b, p.tail)
		}
	}
	if k != p.cached {
		return fmt.Errorf("scheduler: pool: LRU list holds %d blocks, %d cached", k, p.cached)
	}
	return nil
}

func (p *Pool) pushLRU(b BlockID) {
	i := int32(b)
	p.prev[i], p.next[i] = p.tail, -1
	if p.tail >= 0 {
		p.next[p.tail] = i
	} else {
		p.head = i
	}
	p.tail = i
}

func (p *Pool) unlink(b BlockID) {
	i := int32(b)
	if p.prev[i] >= 0 {
		p.next[p.prev[i]] = p.next[i]
	} else {
		p.head = p.next[i]
	}
	if p.next[i] >= 0 {
		p.prev[p.next[i]] = p.prev[i]
	} else {
		p.tail = p.prev[i]
	}
	p.prev[i], p.next[i] = -1, -1
}

func (p *Pool) unindex(b BlockID) {
	if p.index[b] {
		delete(p.cache, p.key[b])
		p.index[b] = false
		p.key[b] = poolKey{}
	}
}

func (p *Pool) findNS(ns hashing.Namespace) (uint32, bool) {
	d := ns.Digest()
	for i := range p.nss {
		if p.nss[i] == d {
			return uint32(i), true
		}
	}
	return 0, false
}

func (p *Pool) internNS(ns hashing.Namespace) uint32 {
	if id, ok := p.findNS(ns); ok {
		return id
	}
	p.nss = append(p.nss, ns.Digest())
	return uint32(len(p.nss) - 1)
}
