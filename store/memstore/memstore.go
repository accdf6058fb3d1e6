package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/internal/mapped"
	"github.com/kvconnect/kvconnect/internal/regset"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

var (
	_ store.Store    = (*Store)(nil)
	_ store.Vectored = (*Store)(nil)
	_ store.Leaser   = (*Store)(nil)
	_ store.Watcher  = (*Store)(nil)
)

// Store is the embedded in-process store. Create one with [New]; it is safe
// for concurrent use by multiple goroutines.
type Store struct {
	cfg        Config
	log        *slog.Logger
	mem        *rdma.HostMemory
	buf        []byte // the arena's bytes, valid until Close
	highUnits  int64  // HighWatermark of the arena, in units
	evictUnits int64  // EvictRatio of the arena, in units
	seed       maphash.Seed
	shards     []shard
	clock      atomic.Uint64 // LRU clock: one tick per key put or read
	regs       regset.Set
	counters   counters
	groups     groupPool
	feeds      store.Feeds // store.Watcher: KeyEvicted and KeyRemoved

	// copyHook, set by tests only, is called by Get after it pinned an
	// entry and before it copies the entry's bytes out.
	copyHook func(key string)

	// life is read-locked by every call for its whole duration and
	// write-locked by Close, which so waits for calls in flight.
	life struct {
		sync.RWMutex
		closed bool
	}

	// alloc guards the arena allocator. Lock order: a shard's mu, then
	// alloc; never the other way round.
	alloc struct {
		sync.Mutex
		a *arena
	}

	// evict serialises evictions; it is taken with no other lock held.
	evict struct {
		sync.Mutex
		gen    atomic.Uint64 // completed eviction rounds
		cursor []uint64      // per shard: stamp of its oldest evictable entry
		nodes  []int32       // extents to free after a shard is unlocked
	}
}

// shard is one independently locked part of the key index.
type shard struct {
	mu    sync.Mutex
	ix    index    // the keys, their entries and the LRU list
	keys  int64    // entries in the index
	bytes int64    // value bytes of entries in the index
	_     [64]byte // keeps neighbouring shards' locks off one cache line
}

// counters are the cumulative Stats fields, updated once per call.
type counters struct {
	hits, misses, exists, puts, duplicates, rejected, evictions, bytesIn, bytesOut atomic.Int64
}

// New maps cfg.Capacity bytes of host memory and returns an empty store
// over it. It fills in cfg's defaults and returns an error naming the field
// and value that are out of range, or the mapping's error.
func New(cfg Config) (*Store, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mem, err := rdma.AllocHost(int(cfg.Capacity))
	if err != nil {
		return nil, fmt.Errorf("memstore: new store of %d bytes: %w", cfg.Capacity, err)
	}
	units := cfg.Capacity >> unitShift
	s := &Store{
		cfg:        cfg,
		log:        cfg.Logger,
		mem:        mem,
		buf:        mem.Bytes(),
		highUnits:  int64(float64(units) * cfg.HighWatermark),
		evictUnits: max(1, int64(float64(units)*cfg.EvictRatio)),
		seed:       maphash.MakeSeed(),
		shards:     make([]shard, cfg.Shards),
	}
	s.alloc.a = newArena(units)
	s.evict.cursor = make([]uint64, cfg.Shards)
	for i := range s.shards {
		s.shards[i].ix.init()
	}
	return s, nil
}

// enter starts a call: it fails with store.ErrClosed once the store is
// closed, and otherwise holds Close off until exit.
func (s *Store) enter() error {
	s.life.RLock()
	if s.life.closed {
		s.life.RUnlock()
		return store.ErrClosed
	}
	return nil
}

func (s *Store) exit() { s.life.RUnlock() }

// hash returns the hash of key: its high 32 bits pick the shard, its low
// 32 bits the place in the shard's table.
func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }

// shardOf maps a key's hash to a shard, reduced to [0, len(s.shards)) by
// a multiplication (no division).
func (s *Store) shardOf(h uint64) int {
	return int(((h >> 32) * uint64(len(s.shards))) >> 32)
}

// ticks reserves n ticks of the LRU clock and returns the first.
func (s *Store) ticks(n int) uint64 { return s.clock.Add(uint64(n)) - uint64(n) + 1 }

// canceled reports whether done is closed without blocking; a nil done
// (a context that is never canceled) is never closed.
func canceled(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// start checks the whole-call conditions of a batch call and enters it.
func (s *Store) start(ctx context.Context, op string, keys, regions, res int) error {
	if err := store.CheckBatch(op, keys, regions, res); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.enter()
}

// Exists reports for each key whether it is present, and its value's size
// in res[i].N (0 for an absent key). It grants no lease and does not count as a use for LRU: a key
// reported present may be evicted before a later Get, which then returns
// store.ErrNotFound. Per-key errors: store.ErrNotFound, store.ErrInvalidKey.
//
// A batch is probed a few shards at a time, each shard locked once for
// all its keys.
func (s *Store) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if err := s.start(ctx, "exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	defer s.exit()
	g := s.group(keys, res)
	defer s.groups.put(g)
	done := ctx.Done()
	probed := 0
	for start := 0; start < len(g.order); {
		// A window of up to existsWindow shards, locked in ascending
		// order (no other call holds two shard locks), whose lookups are
		// staged together (see touch).
		end, shards := start, 0
		for end < len(g.order) {
			if end == start || g.shard[g.order[end]] != g.shard[g.order[end-1]] {
				if shards == existsWindow {
					break
				}
				shards++
				s.shards[g.shard[g.order[end]]].mu.Lock()
			}
			end++
		}
		g.sink += s.touch(keys, g, g.order[start:end])
		stop := -1 // where ctx was found done
		for j := start; j < end; j++ {
			if canceled(done) {
				stop = j
				break
			}
			i := g.order[j]
			ix := &s.shards[g.shard[i]].ix
			if id, size := ix.find(keys[i], g.hash[i]); id != 0 {
				res[i] = store.Result{N: size}
			} else {
				res[i] = store.Result{Err: store.ErrNotFound}
			}
		}
		for j := start; j < end; j++ {
			if j == start || g.shard[g.order[j]] != g.shard[g.order[j-1]] {
				s.shards[g.shard[g.order[j]]].mu.Unlock()
			}
		}
		if stop >= 0 {
			probed += stop - start
			for _, i := range g.order[stop:] {
				res[i] = store.Result{Err: ctx.Err()}
			}
			break
		}
		probed += end - start
		start = end
	}
	s.counters.exists.Add(int64(probed))
	return nil
}

// existsWindow is how many shards an exists holds locked at once.
const existsWindow = 8

// touch reads the first slot and the key's record of each keys[i] for i
// in order, whose shards the caller holds locked, each stage for all the
// keys before the next: the reads of one stage do not depend on each
// other, so the processor overlaps their cache misses, and the finds that
// follow hit the cache. With millions of keys the index is out of the
// cache, and a find on its own waits for two misses in a row (three when
// the record straddles a line). It returns a value that depends on what
// it read, so that the reads are kept.
func (s *Store) touch(keys []string, g *grouping, order []int32) uint64 {
	const chunk = 32
	var sink uint64
	var krefs [chunk]uint32
	for len(order) > 0 {
		n := min(len(order), chunk)
		for k, i := range order[:n] {
			ix := &s.shards[g.shard[i]].ix
			h := g.hash[i]
			sl := ix.slots[h&uint64(len(ix.slots)-1)]
			krefs[k] = 0
			if sl != 0 && sl>>32 == tagOf(h) {
				krefs[k] = uint32(sl)
			}
		}
		for k, i := range order[:n] {
			if kref := krefs[k]; kref != 0 {
				rec := s.shards[g.shard[i]].ix.rec(kref)
				sink += uint64(rec[0])
				if end := recHdr + len(keys[i]) - 1; end < len(rec) {
					sink += uint64(rec[end])
				}
			}
		}
		order = order[n:]
	}
	return sink
}

// grouping orders the valid keys of a batch by shard.
type grouping struct {
	sink  uint64   // what index.touch read, kept so that its reads are not dropped
	hash  []uint64 // per key: its hash
	shard []int32  // per key: its shard
	order []int32  // indices of the valid keys, grouped by shard
	count []int32  // per shard + 1: counting-sort offsets
}

// groupPool keeps groupings for reuse, so that batch calls allocate nothing
// in steady state. (A sync.Pool would too, but it drops items at random
// under the race detector.)
type groupPool struct {
	mu   sync.Mutex
	free []*grouping
}

func (p *groupPool) get() *grouping {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		g := p.free[n-1]
		p.free = p.free[:n-1]
		return g
	}
	return new(grouping)
}

func (p *groupPool) put(g *grouping) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < 64 {
		p.free = append(p.free, g)
	}
}

// group validates keys, writing the errors of invalid ones into res, and
// returns the valid ones grouped by shard (a counting sort by shard index).
func (s *Store) group(keys []string, res []store.Result) *grouping {
	g := s.groups.get()
	n := len(keys)
	g.shard = slices.Grow(g.shard[:0], n)[:n]
	g.hash = slices.Grow(g.hash[:0], n)[:n]
	g.order = g.order[:0]
	g.count = slices.Grow(g.count[:0], len(s.shards)+1)[:len(s.shards)+1]
	clear(g.count)
	valid := 0
	for i, key := range keys {
		if err := store.ValidateKey(key); err != nil {
			res[i] = store.Result{Err: err}
			g.shard[i] = -1
			continue
		}
		h := s.hash(key)
		k := s.shardOf(h)
		g.hash[i] = h
		g.shard[i] = int32(k)
		g.count[k+1]++
		valid++
	}
	for k := 1; k < len(g.count); k++ {
		g.count[k] += g.count[k-1] // count[k]: where shard k's keys start
	}
	g.order = slices.Grow(g.order, valid)[:valid]
	for i, k := range g.shard {
		if k >= 0 {
			g.order[g.count[k]] = int32(i)
			g.count[k]++
		}
	}
	return g
}

// Put copies each src[i] into the store under keys[i], straight from the
// caller's memory into the store's. A present key keeps its first value
// (the put succeeds and counts as a duplicate). On success res[i].N is
// src[i].Len, for a present key too, as [store.Result] defines it for
// every store: memstore knows the size of the value it keeps, but reports
// what a store that does not know it reports (Exists tells the size).
// When the value would take the memory in use above the high watermark,
// least recently used entries not being read are evicted first; if there
// is still no room the key gets store.ErrNoSpace. Per-key errors:
// store.ErrInvalidKey, store.ErrInvalidRegion, store.ErrNoSpace.
func (s *Store) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i : i+1] }, res)
}

// PutV stores under each keys[i] the concatenation of the regions src[i],
// copied straight from each region into the store's memory, one after the
// other, as [Store.Put] stores one region: the same first-writer-wins rule,
// eviction and errors, and res[i].N the total length of src[i] (a present
// key's too). An empty src[i] is store.ErrInvalidRegion for that key, as
// is any region of it that Put would refuse (the error names which). It
// implements [store.Vectored].
func (s *Store) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i] }, res)
}

// putBatch is Put and PutV: src(i) is the regions of keys[i], nsrc how
// many keys have regions.
func (s *Store) putBatch(ctx context.Context, keys []string, nsrc int, src func(i int) []rdma.Region, res []store.Result) error {
	if err := s.start(ctx, "put", len(keys), nsrc, len(res)); err != nil {
		return err
	}
	defer s.exit()
	done := ctx.Done()
	stamp := s.ticks(len(keys))
	var puts, dups, rejected, bytesIn int64
	for i, key := range keys {
		if canceled(done) {
			failRest(res[i:], ctx.Err())
			break
		}
		n, dup, err := s.put(key, src(i), stamp+uint64(i))
		res[i] = store.Result{N: n, Err: err}
		switch {
		case err == nil && dup:
			dups++
		case err == nil:
			puts++
			bytesIn += int64(n)
		case isNoSpace(err):
			rejected++
		}
	}
	s.counters.puts.Add(puts)
	s.counters.duplicates.Add(dups)
	s.counters.rejected.Add(rejected)
	s.counters.bytesIn.Add(bytesIn)
	return nil
}

// regions checks the regions of one key of a put or get (role "source"
// or "destination") and returns their total length (math.MaxInt if the
// sum would overflow: more than any value).
func (s *Store) regions(op, key, role string, rs []rdma.Region) (int, error) {
	if len(rs) == 0 {
		return 0, fmt.Errorf("%w: %s %.64q: no %s regions", store.ErrInvalidRegion, op, key, role)
	}
	total := 0
	for j, r := range rs {
		if err := s.checkRegion(op, key, role, r); err != nil {
			if len(rs) > 1 {
				err = fmt.Errorf("%w (region %d of %d)", err, j, len(rs))
			}
			return 0, err
		}
		if r.Len > math.MaxInt-total {
			total = math.MaxInt
		} else {
			total += r.Len
		}
	}
	return total, nil
}

// put stores the concatenation of src under key, unless the key is present.
func (s *Store) put(key string, src []rdma.Region, stamp uint64) (n int, dup bool, err error) {
	if err := store.ValidateKey(key); err != nil {
		return 0, false, err
	}
	size, err := s.regions("put", key, "source", src)
	if err != nil {
		return 0, false, err
	}
	h := s.hash(key)
	sh := &s.shards[s.shardOf(h)]
	sh.mu.Lock()
	if id, _ := sh.ix.find(key, h); id != 0 {
		sh.touch(id, stamp)
		sh.mu.Unlock()
		return size, true, nil
	}
	sh.mu.Unlock()

	node, off, err := s.allocate(key, int64(size))
	if err != nil {
		return 0, false, err
	}
	at := off
	for _, r := range src {
		copy(s.buf[at:at+int64(r.Len)], r.Bytes())
		at += int64(r.Len)
	}

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if id, _ := sh.ix.find(key, h); id != 0 { // a concurrent put of the key won
		s.freeNode(node)
		return size, true, nil
	}
	// The index keeps a copy of the key's bytes in its own heap, so that
	// no entry holds the caller's string (often a part of a larger one).
	id := sh.ix.insert(key, h, size)
	if id == 0 {
		s.freeNode(node)
		return 0, false, fmt.Errorf("%w: put %.64q: the shard's key heap is full (4 GiB of keys)", store.ErrNoSpace, key)
	}
	e := &sh.ix.ents[id]
	e.off, e.node, e.stamp = off, node, stamp
	sh.pushFront(id)
	s.announce(sh, id, store.KeyStored)
	sh.keys++
	sh.bytes += int64(size)
	return size, false, nil
}

// Get copies the value of each keys[i] straight from the store's memory
// into dst[i], and sets res[i].N to its size. A value being copied out
// cannot be evicted, and a Remove of it frees its memory only once every
// copy has ended. Per-key errors: store.ErrNotFound,
// store.ErrBufferTooSmall (dst[i] is not written), store.ErrInvalidKey,
// store.ErrInvalidRegion. memstore never returns store.ErrLeaseExpired.
func (s *Store) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i : i+1] }, res)
}

// GetV copies the value of each keys[i] straight from the store's memory
// across the regions dst[i], filling each before the next, and sets
// res[i].N to its size; a value shorter than the regions together fills a
// prefix of them and leaves the rest unchanged. A value longer than the
// regions together is store.ErrBufferTooSmall and nothing is written; an
// empty dst[i] is store.ErrInvalidRegion. Otherwise as [Store.Get]: the
// value is pinned while it is copied. It implements [store.Vectored].
func (s *Store) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i] }, res)
}

// getBatch is Get and GetV: dst(i) is the regions of keys[i], ndst how
// many keys have regions.
func (s *Store) getBatch(ctx context.Context, keys []string, ndst int, dst func(i int) []rdma.Region, res []store.Result) error {
	if err := s.start(ctx, "get", len(keys), ndst, len(res)); err != nil {
		return err
	}
	defer s.exit()
	done := ctx.Done()
	stamp := s.ticks(len(keys))
	var hits, misses, bytesOut int64
	for i, key := range keys {
		if canceled(done) {
			failRest(res[i:], ctx.Err())
			break
		}
		n, err := s.get(key, dst(i), stamp+uint64(i))
		res[i] = store.Result{N: n, Err: err}
		switch {
		case err == nil:
			hits++
			bytesOut += int64(n)
		case err == store.ErrNotFound:
			misses++
		}
	}
	s.counters.hits.Add(hits)
	s.counters.misses.Add(misses)
	s.counters.bytesOut.Add(bytesOut)
	return nil
}

// get copies the value of key across dst, filling each region before the
// next, with the entry pinned.
func (s *Store) get(key string, dst []rdma.Region, stamp uint64) (int, error) {
	if err := store.ValidateKey(key); err != nil {
		return 0, err
	}
	room, err := s.regions("get", key, "destination", dst)
	if err != nil {
		return 0, err
	}
	h := s.hash(key)
	sh := &s.shards[s.shardOf(h)]
	sh.mu.Lock()
	id, size := sh.ix.find(key, h)
	if id == 0 {
		sh.mu.Unlock()
		return 0, store.ErrNotFound
	}
	e := &sh.ix.ents[id]
	off := e.off
	if size > room {
		sh.mu.Unlock()
		return 0, fmt.Errorf("%w: get %.64q: value of %d bytes, destination of %d", store.ErrBufferTooSmall, key, size, room)
	}
	e.pins++
	sh.touch(id, stamp)
	sh.mu.Unlock()

	if s.copyHook != nil {
		s.copyHook(key)
	}
	at, left := off, int64(size)
	for _, r := range dst {
		if left == 0 {
			break
		}
		n := min(int64(r.Len), left)
		copy(r.Bytes()[:n], s.buf[at:at+n])
		at += n
		left -= n
	}

	sh.mu.Lock()
	e = &sh.ix.ents[id] // the entries may have moved
	e.pins--
	if e.pins == 0 && e.dead {
		s.freeEntry(sh, id)
	}
	sh.mu.Unlock()
	return size, nil
}

// Remove deletes key, or returns store.ErrNotFound. The memory of a value
// being copied out by a Get is freed when the copy ends.
func (s *Store) Remove(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	h := s.hash(key)
	sh := &s.shards[s.shardOf(h)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id, _ := sh.ix.find(key, h)
	if id == 0 {
		return store.ErrNotFound
	}
	s.drop(sh, id, h, store.KeyRemoved)
	return nil
}

// RemovePrefix deletes every key that starts with prefix and returns how
// many it deleted. The prefix must be a valid key (store.ValidateKey): an
// empty one is an error wrapping store.ErrInvalidKey; use RemoveAll.
func (s *Store) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := store.ValidateKey(prefix); err != nil {
		return 0, fmt.Errorf("memstore: remove prefix: %w", err)
	}
	return s.removeMatching(ctx, func(key string) bool { return strings.HasPrefix(key, prefix) })
}

// RemoveAll deletes every key and returns how many it deleted.
func (s *Store) RemoveAll(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return s.removeMatching(ctx, nil)
}

// removeMatching deletes the keys match accepts (all when match is nil),
// one shard at a time, checking ctx between shards.
func (s *Store) removeMatching(ctx context.Context, match func(string) bool) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	n := 0
	for i := range s.shards {
		if i > 0 {
			if err := ctx.Err(); err != nil {
				return n, err
			}
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		for id := int32(1); int(id) < len(sh.ix.ents); id++ {
			e := &sh.ix.ents[id]
			if e.klen == 0 {
				continue // free, or out of the index and being read
			}
			if key := sh.ix.key(e); match == nil || match(key) {
				s.drop(sh, id, s.hash(key), store.KeyRemoved)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// Register records r, a host region, so that Put and Get may use it when
// Config.RequireRegistered is set. memstore itself needs no registration.
// A region that overlaps a registered one is refused with an error wrapping
// store.ErrInvalidRegion.
func (s *Store) Register(r rdma.Region) error {
	if err := checkShape(r); err != nil {
		return fmt.Errorf("%w: register %s", store.ErrInvalidRegion, err)
	}
	if err := mapped.Check(r.Addr, r.Len); err != nil && !errors.Is(err, mapped.ErrUnsupported) {
		return fmt.Errorf("%w: register: %v", store.ErrInvalidRegion, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	return s.regs.Add(r)
}

// Unregister forgets a region recorded by Register; r must equal it. The
// region must not be in use by a call.
func (s *Store) Unregister(r rdma.Region) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	return s.regs.Remove(r)
}

// Stats returns a snapshot of the store's counters. Keys and Bytes are
// summed shard by shard, so under concurrent writes they are approximate.
func (s *Store) Stats() store.Stats {
	st := store.Stats{
		Capacity:     s.cfg.Capacity,
		Hits:         s.counters.hits.Load(),
		Misses:       s.counters.misses.Load(),
		Exists:       s.counters.exists.Load(),
		Puts:         s.counters.puts.Load(),
		Duplicates:   s.counters.duplicates.Load(),
		RejectedPuts: s.counters.rejected.Load(),
		Evictions:    s.counters.evictions.Load(),
		BytesIn:      s.counters.bytesIn.Load(),
		BytesOut:     s.counters.bytesOut.Load(),
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.keys
		st.Bytes += sh.bytes
		sh.mu.Unlock()
	}
	return st
}

// Leases reports that memstore grants no read leases: the zero
// store.Leases. Remove, RemovePrefix and RemoveAll take every key they
// name at once, and never fail with store.ErrHasLease; a Get that is
// copying a value out when its key is removed keeps its memory until the
// copy ends, with no effect on the removal. It implements [store.Leaser].
func (s *Store) Leases() store.Leases { return store.Leases{} }

// Watch implements [store.Watcher]: the feed reports every key that a put
// adds (store.KeyStored; a duplicate put adds nothing), every key that an
// eviction drops (store.KeyEvicted) and every key that Remove,
// RemovePrefix or RemoveAll deletes (store.KeyRemoved), each key's events
// in the order they happened, with an empty Medium. memstore has one tier
// and no time to live: it announces no store.KeyExpired. A reader that
// tracks keys while a put of them is in flight learns from the order of
// KeyStored and KeyEvicted whether the key is there after the put. Close closes every feed; the values it
// drops then are not announced, and a later Watch returns store.ErrClosed.
func (s *Store) Watch(n int) (*store.Feed, error) {
	if err := s.enter(); err != nil {
		return nil, fmt.Errorf("memstore: watch: %w", err)
	}
	defer s.exit()
	return s.feeds.Watch(n)
}

// Close waits for the calls in flight, then drops every value and unmaps
// the store's memory. Later calls return store.ErrClosed. Close is
// idempotent: later calls return nil.
func (s *Store) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return nil
	}
	s.life.closed = true
	s.feeds.Close()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.ix = index{}
		sh.keys, sh.bytes = 0, 0
		sh.mu.Unlock()
	}
	s.buf = nil
	if err := s.mem.Free(); err != nil {
		return fmt.Errorf("memstore: close: %w", err)
	}
	return nil
}

// drop takes entry id, whose key has hash h, out of the index and frees
// its memory, or leaves that to the last Get copying out of it. The caller
// holds sh.mu. It is where Remove, RemovePrefix and RemoveAll drop keys,
// and it announces op to the store's feeds; evictRound drops them through
// unindex too, and announces them itself.
func (s *Store) drop(sh *shard, id int32, h uint64, op store.KeyOp) {
	s.announce(sh, id, op)
	sh.unindex(id, h)
	e := &sh.ix.ents[id]
	if e.pins > 0 {
		e.dead = true
		return
	}
	s.freeEntry(sh, id)
}

// unindex takes entry id, whose key has hash h, out of the index and the
// LRU list, and out of the shard's counts; its memory stays. The caller
// holds sh.mu.
func (sh *shard) unindex(id int32, h uint64) {
	sh.keys--
	sh.bytes -= int64(sh.ix.size(id))
	sh.unlink(id)
	sh.ix.remove(id, h)
}

// announce tells the store's feeds that the key of entry id, still in the
// index, was stored or left by op. The event holds a copy of the key: the
// index's bytes are reused once the entry goes. The caller holds sh.mu.
func (s *Store) announce(sh *shard, id int32, op store.KeyOp) {
	if s.feeds.Watching() {
		s.feeds.Announce(store.KeyEvent{Key: strings.Clone(sh.ix.key(&sh.ix.ents[id])), Op: op})
	}
}

// freeEntry frees the memory of entry id, which is out of the index and
// unpinned, and keeps the entry for reuse. The caller holds sh.mu.
func (s *Store) freeEntry(sh *shard, id int32) {
	s.freeNode(sh.ix.ents[id].node)
	sh.ix.release(id)
}

func (s *Store) freeNode(node int32) {
	s.alloc.Lock()
	s.alloc.a.free(node)
	s.alloc.Unlock()
}

func failRest(res []store.Result, err error) {
	for i := range res {
		res[i] = store.Result{Err: err}
	}
}

func (sh *shard) pushFront(id int32) {
	ents := sh.ix.ents
	e := &ents[id]
	e.prev = 0
	e.next = ents[0].next
	ents[e.next].prev = id
	ents[0].next = id
}

func (sh *shard) unlink(id int32) {
	ents := sh.ix.ents
	e := &ents[id]
	ents[e.prev].next = e.next
	ents[e.next].prev = e.prev
	e.prev, e.next = 0, 0
}

// touch marks entry id as used at stamp: it moves to the front of the LRU
// list.
func (sh *shard) touch(id int32, stamp uint64) {
	e := &sh.ix.ents[id]
	e.stamp = max(e.stamp, stamp)
	if sh.ix.ents[0].next != id {
		sh.unlink(id)
		sh.pushFront(id)
	}
}

// oldestEvictable returns the least recently used entry that no Get is
// copying out of, or 0.
func (sh *shard) oldestEvictable() int32 {
	ents := sh.ix.ents
	for id := ents[0].prev; id != 0; id = ents[id].prev {
		if ents[id].pins == 0 {
			return id
		}
	}
	return 0
}
