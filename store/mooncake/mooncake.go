package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/internal/mapped"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Store is a client of a Mooncake Store cluster, bound to
// libmooncake_store.so at run time. It implements [store.Store]. Create it
// with [Open]; it is safe for concurrent use.
type Store struct {
	lib     *api
	handle  uintptr // mooncake_store_t
	cfg     Config
	log     *slog.Logger
	persist []byte  // setup strings and the replication config, for the store's life
	repl    uintptr // address of the replication config in persist, or 0 for NULL
	arenas  arenaPool

	mu struct {
		// Batch calls hold the read lock for their whole native call;
		// Register, Unregister and Close take the write lock, so they wait
		// for calls in flight and no call sees a region disappear.
		sync.RWMutex
		closed  bool
		regions []rdma.Region // registered, sorted by Addr, disjoint
	}
	stats struct {
		exists, hits, misses, puts, dups, rejected, bytesIn, bytesOut atomic.Int64
	}
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Leaser = (*Store)(nil)
)

// Force passed to every removal: none. Exists and get leave a read lease
// on a key (10 s by default) during which a removal without force fails
// with -706 (remove) or skips the key (remove_by_regex, remove_all). With
// force, Mooncake frees the value's memory at once, and a put may reuse it
// while a get in flight still reads it: that get then returns another
// key's bytes as success.
const force = 0

// Pauses between the tries of a Remove of a key under a lease: doubling
// from the first to the last.
const (
	removePauseFirst = time.Millisecond
	removePauseMax   = 100 * time.Millisecond
)

// Open loads the Mooncake Store C library (cfg.Library, else
// MOONCAKE_STORE_LIBRARY, else libmooncake_store.so on the loader path),
// starts a client with cfg and connects it to the master.
//
// A missing library, or one that lacks a runtime library it needs, is an
// error wrapping store.ErrUnavailable that names what is missing; so is a
// setup that fails (master unreachable, bad address, transport not built
// in), as an [Error] with Op "setup".
//
// Setup blocks until the master answers or gives up, which takes about
// 90 s for an unreachable master and cannot be interrupted. When ctx ends
// first, Open returns ctx's error at once and leaves the setup running;
// when it ends, the client is destroyed and its memory released.
//
// The client is created on a goroutine locked to an OS thread other than
// the main thread, with SIGINT, SIGTERM, SIGHUP and SIGUSR1 unblocked on it
// again before setup (Mooncake blocks them there to route them to its own
// signal thread, which would end the process on Ctrl-C instead of letting
// Go's handlers see it). That thread is discarded once setup returns.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mooncake: open: %w", err)
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lib, err := load(cfg.Library)
	if err != nil {
		return nil, err
	}
	return open(ctx, cfg, lib)
}

func open(ctx context.Context, cfg Config, lib *api) (*Store, error) {
	s := &Store{lib: lib, cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	strs := []string{cfg.LocalHostname, cfg.MetadataServer, cfg.Protocol, cfg.DeviceName, cfg.MasterServerAddress}
	size := replicateSize + 8*len(cfg.PreferredSegments)
	for _, v := range append(strs, cfg.PreferredSegments...) {
		size += len(v) + 1
	}
	persist, err := mapMem(size)
	if err != nil {
		return nil, err
	}
	s.persist = persist
	a := arena{mem: persist}
	if cfg.ReplicaNum > 0 || len(cfg.PreferredSegments) > 0 {
		s.repl = a.addr(0)
		a.words(replicateOffReplicaNum, 1)[0] = uintptr(cfg.ReplicaNum)
		if m := len(cfg.PreferredSegments); m > 0 {
			a.words(replicateOffPreferred, 1)[0] = a.addr(replicateSize)
			a.words(replicateOffPreferredN, 1)[0] = uintptr(m)
		}
	}
	off := replicateSize + 8*len(cfg.PreferredSegments)
	segs := a.words(replicateSize, len(cfg.PreferredSegments))
	for i, seg := range cfg.PreferredSegments {
		segs[i] = a.addr(off)
		off = a.cstring(off, seg)
	}
	var ptr [5]uintptr
	for i, v := range strs {
		ptr[i] = a.addr(off)
		off = a.cstring(off, v)
	}

	type result struct {
		handle uintptr
		err    error
	}
	results := make(chan result)
	abandon := make(chan struct{})
	go func() {
		var r result
		onNativeThread(func() {
			h := lib.create()
			if h == 0 {
				r.err = Error{Op: opCreate, Code: CodeInternal}
				return
			}
			if err := unblockSignals(); err != nil {
				lib.destroy(h)
				r.err = err
				return
			}
			rc := lib.setup(h, ptr[0], ptr[1], uint64(cfg.GlobalSegmentSize), uint64(cfg.LocalBufferSize), ptr[2], ptr[3], ptr[4])
			if rc != 0 {
				lib.destroy(h)
				r.err = Error{Op: opSetup, Code: int(rc)}
				return
			}
			r.handle = h
		})
		select {
		case results <- r:
		case <-abandon:
			if r.handle != 0 {
				onNativeThread(func() { lib.destroy(r.handle) })
			}
			unmapMem(persist)
			s.log.Info("mooncake: setup finished after Open gave up; client destroyed", "err", r.err)
		}
	}()
	select {
	case r := <-results:
		if r.err != nil {
			unmapMem(persist)
			return nil, fmt.Errorf("mooncake: open: client with master %s, metadata %s, protocol %s: %w%s",
				cfg.MasterServerAddress, cfg.MetadataServer, cfg.Protocol, r.err, setupHint(r.err))
		}
		s.handle = r.handle
	case <-ctx.Done():
		close(abandon)
		return nil, fmt.Errorf("mooncake: open (master %s): %w; setup goes on in the background and is undone when it ends", cfg.MasterServerAddress, ctx.Err())
	}
	s.log.Info("mooncake: client started", "master", cfg.MasterServerAddress,
		"metadata", cfg.MetadataServer, "protocol", cfg.Protocol, "segment", cfg.GlobalSegmentSize)
	return s, nil
}

// Config returns the configuration the store was opened with, defaults
// applied.
func (s *Store) Config() Config { return s.cfg }

// lockCall takes the read lock for a call and reports ErrClosed.
func (s *Store) lockCall(op string) error {
	s.mu.RLock()
	if s.mu.closed {
		s.mu.RUnlock()
		return fmt.Errorf("mooncake: %s: %w", op, store.ErrClosed)
	}
	return nil
}

// layout of a batch of n native entries in an arena: pointer arrays,
// results, the map back to the caller's indexes, then key bytes, then
// (for batches of more than one key) the table that finds repeated keys.
type layout struct{ n, keys, bufs, sizes, res, idx, text, tbl, slots, size int }

func newLayout(n, keyBytes int) layout {
	l := layout{n: n, keys: 0, bufs: 8 * n, sizes: 16 * n, res: 24 * n, idx: 32 * n}
	l.text = (36*n + 7) &^ 7
	l.tbl = (l.text + keyBytes + 7) &^ 7
	if n > 1 {
		l.slots = 16
		for l.slots < 2*n {
			l.slots *= 2
		}
	}
	l.size = l.tbl + 8*l.slots
	return l
}

// markRepeats finds the valid keys (res[i].Err nil) named more than once
// and marks every occurrence but one with res[i].N = -1 - slot, the slot
// of t holding the occurrence that goes to the native call: the first,
// or with longest the one with the longest region. It returns how many
// it marked.
func markRepeats(t repeatTable, keys []string, regions []rdma.Region, res []store.Result, longest bool) int {
	marked := 0
	mask := uint64(len(t) - 1)
	for i, k := range keys {
		if res[i].Err != nil {
			continue
		}
		h := keyHash(k)
		tag := h &^ 0xffffffff
		for p := h & mask; ; p = (p + 1) & mask {
			e := t[p]
			if e == 0 {
				t[p] = tag | uint64(i+1)
				break
			}
			j := int(uint32(e)) - 1
			if e&^0xffffffff != tag || keys[j] != k {
				continue
			}
			marked++
			if longest && regions[i].Len > regions[j].Len {
				t[p] = tag | uint64(i+1)
				res[j].N = -1 - int(p)
			} else {
				res[i].N = -1 - int(p)
			}
			break
		}
	}
	return marked
}

// Exists looks up keys with one mooncake_store_batch_is_exist call for
// the valid ones, then, as the C API reports presence and not size, one
// mooncake_store_get_size call per key found to fill res[i].N (a key
// removed in between reports store.ErrNotFound). With
// Config.PresenceOnly it makes the one batch call only and res[i].N is 0.
// Mooncake grants a read lease (Config.LeaseTTL, 10 s by default) on each
// key found, during which the key is not evicted.
func (s *Store) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if err := store.CheckBatch("exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mooncake: exists: %w", err)
	}
	if err := s.lockCall("exists"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	n, kb := 0, 0
	for i, k := range keys {
		res[i] = store.Result{Err: store.ValidateKey(k)}
		if res[i].Err == nil {
			n++
			kb += len(k) + 1
		}
	}
	s.stats.exists.Add(int64(len(keys)))
	if n == 0 {
		return nil
	}
	l := newLayout(n, kb)
	a, err := s.arenas.get(l.size)
	if err != nil {
		return err
	}
	defer s.arenas.put(a)
	kp, idx := a.words(l.keys, n), a.int32s(l.idx, n)
	off, j := l.text, 0
	for i, k := range keys {
		if res[i].Err != nil {
			continue
		}
		kp[j], idx[j] = a.addr(off), int32(i)
		off = a.cstring(off, k)
		j++
	}
	if rc := s.lib.batchIsExist(s.handle, a.addr(l.keys), uintptr(n), a.addr(l.res)); rc != 0 {
		return fmt.Errorf("mooncake: batch exists of %d keys: %w", n, Error{Op: opExists, Code: int(rc)})
	}
	for j, r := range a.int32s(l.res, n) {
		i := idx[j]
		switch {
		case r == 1 && s.cfg.PresenceOnly:
		case r == 1:
			if size := s.lib.getSize(s.handle, kp[j]); size >= 0 {
				res[i].N = int(size)
			} else {
				res[i].Err = Error{Op: opExists, Code: int(size)}
			}
		case r == 0:
			res[i].Err = Error{Op: opExists, Code: CodeObjectNotFound}
		default:
			res[i].Err = Error{Op: opExists, Code: int(r)}
		}
	}
	return nil
}

// Put stores each src[i] under keys[i] with one
// mooncake_store_batch_put_from call for the valid ones. Each region must
// lie inside a region given to [Store.Register], else that key fails with
// store.ErrInvalidRegion and nothing is sent for it. A key repeated within
// the batch is sent once; its repeats get the first one's outcome. A key
// already in the store keeps its value and counts as success. On success
// res[i].N is src[i].Len, whether the key was stored or present, as
// [store.Result] defines it: Mooncake reports a put of a present key as a
// success like any other (0, with OBJECT_ALREADY_EXISTS only in its log),
// so the binding cannot tell which it was, nor the size of the value the
// key holds, without a get_size request to the master per key.
func (s *Store) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	if err := store.CheckBatch("put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mooncake: put: %w", err)
	}
	if err := s.lockCall("put"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	n, kb := 0, 0
	for i, k := range keys {
		err := store.ValidateKey(k)
		if err == nil {
			err = s.checkRegion(src[i])
		}
		res[i] = store.Result{Err: err}
		if err == nil {
			n++
			kb += len(k) + 1
		}
	}
	if n == 0 {
		return nil
	}
	l := newLayout(n, kb)
	a, err := s.arenas.get(l.size)
	if err != nil {
		return err
	}
	defer s.arenas.put(a)
	var t repeatTable
	dups := 0
	if n > 1 {
		t = a.table(l)
		dups = markRepeats(t, keys, src, res, false) // the repeats' N: resolved after the call
		n -= dups
	}
	kp, bp, sp, idx := a.words(l.keys, n), a.words(l.bufs, n), a.words(l.sizes, n), a.int32s(l.idx, n)
	off, j := l.text, 0
	for i, k := range keys {
		if res[i].Err != nil || res[i].N < 0 {
			continue
		}
		kp[j], bp[j], sp[j], idx[j] = a.addr(off), src[i].Addr, uintptr(src[i].Len), int32(i)
		off = a.cstring(off, k)
		j++
	}
	rc := s.lib.batchPutFrom(s.handle, a.addr(l.keys), a.addr(l.bufs), a.addr(l.sizes), uintptr(n), s.repl, a.addr(l.res))
	if rc != 0 {
		return fmt.Errorf("mooncake: batch put of %d keys: %w", n, Error{Op: opPut, Code: int(rc)})
	}
	var puts, rejected, bytesIn int64
	for j, r := range a.int32s(l.res, n) {
		i := idx[j]
		switch r {
		case 0, CodeObjectAlreadyExists:
			res[i].N = src[i].Len
			puts++
			bytesIn += int64(src[i].Len)
		case CodeNoAvailableHandle:
			rejected++
			res[i].Err = Error{Op: opPut, Code: int(r)}
		default:
			res[i].Err = Error{Op: opPut, Code: int(r)}
		}
	}
	if dups > 0 {
		for i := range res {
			if res[i].Err != nil || res[i].N >= 0 {
				continue
			}
			first := t.at(-1 - res[i].N)
			res[i] = store.Result{Err: res[first].Err}
			if res[i].Err == nil {
				res[i].N = src[i].Len
			}
		}
		s.stats.dups.Add(int64(dups))
	}
	s.stats.puts.Add(puts)
	s.stats.rejected.Add(rejected)
	s.stats.bytesIn.Add(bytesIn)
	return nil
}

// Get copies the value of each key into dst[i] with one
// mooncake_store_batch_get_into call for the valid ones. Each region must
// lie inside a region given to [Store.Register]. A region shorter than the
// value fails with store.ErrBufferTooSmall; a missing key with
// store.ErrNotFound. Mooncake grants a read lease on each key read.
//
// A key named more than once is named once in the native call (Mooncake
// keys a batch's transfers by key and would fill only one of the
// destinations, reporting success for all): the occurrence with the
// longest region is read, and the value is copied from there into the
// other occurrences' regions that hold it (host memory), each judged on
// its own length. An occurrence in device memory is read again instead,
// in one more native call per repeat.
func (s *Store) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	if err := store.CheckBatch("get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mooncake: get: %w", err)
	}
	if err := s.lockCall("get"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	n, kb := 0, 0
	for i, k := range keys {
		err := store.ValidateKey(k)
		if err == nil {
			err = s.checkRegion(dst[i])
		}
		res[i] = store.Result{Err: err}
		if err == nil {
			n++
			kb += len(k) + 1
		}
	}
	if n == 0 {
		return nil
	}
	l := newLayout(n, kb)
	a, err := s.arenas.get(l.size)
	if err != nil {
		return err
	}
	defer s.arenas.put(a)
	var t repeatTable
	repeats := 0
	if n > 1 {
		t = a.table(l)
		repeats = markRepeats(t, keys, dst, res, true)
	}
	idx := a.int32s(l.idx, n)
	m := 0
	for i := range keys {
		if res[i].Err == nil && res[i].N == 0 {
			idx[m] = int32(i)
			m++
		}
	}
	var st getStats
	if err := s.getBatch(a, l, keys, dst, res, idx[:m], &st); err != nil {
		return err
	}
	if repeats > 0 {
		if err := s.fillRepeats(a, l, t, keys, dst, res, &st); err != nil {
			return err
		}
	}
	s.stats.hits.Add(st.hits)
	s.stats.misses.Add(st.misses)
	s.stats.bytesOut.Add(st.bytesOut)
	return nil
}

// getStats are the counters of one Get.
type getStats struct{ hits, misses, bytesOut int64 }

// getBatch copies the values of keys[i], for each i in idx (no key
// twice), into dst[i] with one mooncake_store_batch_get_into call laid out
// in a, and sets res[i]. It returns an error only when the call failed as
// a whole.
func (s *Store) getBatch(a *arena, l layout, keys []string, dst []rdma.Region, res []store.Result, idx []int32, st *getStats) error {
	m := len(idx)
	kp, bp, sp := a.words(l.keys, m), a.words(l.bufs, m), a.words(l.sizes, m)
	off := l.text
	for j, i := range idx {
		kp[j], bp[j], sp[j] = a.addr(off), dst[i].Addr, uintptr(dst[i].Len)
		off = a.cstring(off, keys[i])
	}
	rc := s.lib.batchGetInto(s.handle, a.addr(l.keys), a.addr(l.bufs), a.addr(l.sizes), uintptr(m), a.addr(l.res))
	if rc != 0 {
		return fmt.Errorf("mooncake: batch get of %d keys: %w", m, Error{Op: opGet, Code: int(rc)})
	}
	for j, r := range a.int64s(l.res, m) {
		i := idx[j]
		switch {
		case r >= 0 && r <= int64(dst[i].Len):
			res[i] = store.Result{N: int(r)}
			st.hits++
			st.bytesOut += r
		case r > 0:
			res[i] = store.Result{Err: fmt.Errorf("%w: mooncake: get %q: the library reported %d bytes read into a %d-byte region",
				store.ErrTransfer, keys[i], r, dst[i].Len)}
		case r == CodeObjectNotFound || r == CodeReplicaNotReady:
			st.misses++
			res[i] = store.Result{Err: Error{Op: opGet, Code: int(r)}}
		default:
			res[i] = store.Result{Err: Error{Op: opGet, Code: int(r)}}
		}
	}
	return nil
}

// fillRepeats settles the occurrences of repeated keys that markRepeats
// left out of the native call. One in host memory gets the outcome of the
// occurrence read, judged against its own region, and a copy of the value
// from that occurrence's region (host memory too). The others are read
// again, in as many more native calls as a key has such occurrences.
func (s *Store) fillRepeats(a *arena, l layout, t repeatTable, keys []string, dst []rdma.Region, res []store.Result, st *getStats) error {
	again := 0
	for i := range res {
		if res[i].Err != nil || res[i].N >= 0 {
			continue
		}
		j := t.at(-1 - res[i].N)
		if !dst[i].Loc.IsHost() || !dst[j].Loc.IsHost() {
			res[i].N = -1 // read again below
			again++
			continue
		}
		switch r := res[j]; {
		case r.Err != nil:
			res[i] = store.Result{Err: r.Err}
			if errors.Is(r.Err, store.ErrNotFound) {
				st.misses++
			}
		case r.N > dst[i].Len:
			res[i] = store.Result{Err: Error{Op: opGet, Code: CodeInvalidParams}}
		default:
			copy(dst[i].Bytes()[:r.N], dst[j].Bytes()[:r.N])
			res[i] = store.Result{N: r.N}
			st.hits++
			st.bytesOut += int64(r.N)
		}
	}
	for again > 0 {
		t = a.table(l)
		idx := a.int32s(l.idx, l.n)
		m := 0
		for i := range res {
			if res[i].Err != nil || res[i].N >= 0 {
				continue
			}
			if _, prev := t.add(keyHash(keys[i]), keys, i); prev < 0 {
				idx[m] = int32(i)
				m++
			}
		}
		if err := s.getBatch(a, l, keys, dst, res, idx[:m], st); err != nil {
			return err
		}
		again -= m
	}
	return nil
}

// checkRegion reports why r cannot be handed to native code for a put or
// a get: it must be non-empty and lie inside one registered region.
// Call with s.mu held.
func (s *Store) checkRegion(r rdma.Region) error {
	if r.Len <= 0 || r.Addr == 0 {
		return fmt.Errorf("%w: mooncake: empty region {Addr: %#x, Len: %d}", store.ErrInvalidRegion, r.Addr, r.Len)
	}
	regs := s.mu.regions
	lo, hi := 0, len(regs)
	for lo < hi { // first region with Addr > r.Addr
		m := int(uint(lo+hi) >> 1)
		if regs[m].Addr <= r.Addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 || !regs[lo-1].Contains(r) {
		return fmt.Errorf("%w: mooncake: region [%#x, +%d) on %s is not inside a registered region", store.ErrInvalidRegion, r.Addr, r.Len, r.Loc)
	}
	return nil
}

// Remove deletes key (mooncake_store_remove without force). It returns an
// error matching store.ErrNotFound when the key is absent.
//
// A key under a read lease (Mooncake grants one for
// --default_kv_lease_ttl, 10 s by default, on every exists or get that
// finds it) or being read is not removed: Remove tries again, with pauses
// from 1 ms doubling to 100 ms, for up to Config.RemoveLeaseWait, and then
// returns an error matching store.ErrHasLease; the key stays, whole and
// readable. Remove holds no lock while it pauses, and returns ctx's error
// when ctx ends during a pause.
func (s *Store) Remove(ctx context.Context, key string) error {
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("mooncake: remove: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mooncake: remove: %w", err)
	}
	a, err := s.arenas.get(len(key) + 1)
	if err != nil {
		return err
	}
	defer s.arenas.put(a)
	a.cstring(0, key)
	var waited time.Duration
	pause := removePauseFirst
	for tries := 1; ; tries++ {
		if err := s.lockCall("remove"); err != nil {
			return err
		}
		rc := s.lib.remove(s.handle, a.addr(0), force)
		s.mu.RUnlock()
		switch {
		case rc == 0:
			return nil
		case rc != CodeObjectHasLease:
			return fmt.Errorf("mooncake: remove %q: %w", key, Error{Op: opRemove, Code: int(rc)})
		case waited >= s.cfg.RemoveLeaseWait:
			return fmt.Errorf("mooncake: remove %q: the key is under a read lease or being read, still after %d tries in %v "+
				"(Config.RemoveLeaseWait %v; a lease lasts the master's --default_kv_lease_ttl, %v by Config.LeaseTTL, after the last exists or get): %w",
				key, tries, waited, s.cfg.RemoveLeaseWait, s.Leases().TTL, Error{Op: opRemove, Code: int(rc)})
		}
		d := min(pause, s.cfg.RemoveLeaseWait-waited)
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("mooncake: remove %q: waiting for a read lease to end: %w", key, ctx.Err())
		case <-timer.C:
		}
		waited += d
		pause = min(2*pause, removePauseMax)
	}
}

// RemovePrefix deletes every key that starts with prefix through
// mooncake_store_remove_by_regex without force, with the anchored,
// escaped prefix ("^" + prefix with every regular-expression
// metacharacter escaped). The prefix follows the rules of keys
// (store.ValidateKey).
//
// Keys under a read lease, or being read, are left in place, whole and
// readable, and are not counted: Mooncake's master skips them and reports
// only how many it removed, so the binding cannot say how many it left.
// They go with a later RemovePrefix once their leases end (the master's
// --default_kv_lease_ttl after their last exists or get), or by eviction.
// Purge by rotating the key identity first (see package store).
func (s *Store) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if prefix == "" {
		return 0, fmt.Errorf("mooncake: remove prefix: %w: empty prefix (use RemoveAll)", store.ErrInvalidKey)
	}
	if err := store.ValidateKey(prefix); err != nil {
		return 0, fmt.Errorf("mooncake: remove prefix: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("mooncake: remove prefix: %w", err)
	}
	if err := s.lockCall("remove prefix"); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	pattern := prefixPattern(prefix)
	a, err := s.arenas.get(len(pattern) + 1)
	if err != nil {
		return 0, err
	}
	defer s.arenas.put(a)
	a.cstring(0, pattern)
	n := s.lib.removeByRegex(s.handle, a.addr(0), force)
	if n < 0 {
		return 0, fmt.Errorf("mooncake: remove prefix %q (regex %q): %w", prefix, pattern, Error{Op: opRegex, Code: int(n)})
	}
	return int(n), nil
}

// prefixPattern returns the regular expression that matches the keys
// starting with prefix, in the ECMAScript syntax the master uses (and in
// POSIX extended syntax alike): "^" and prefix with each of \^$.|?*+()[]{}
// escaped by a backslash. Letters and digits are never escaped (in
// ECMAScript "\d" or "\1" would mean something else).
func prefixPattern(prefix string) string {
	var b strings.Builder
	b.Grow(1 + 2*len(prefix))
	b.WriteByte('^')
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		if strings.IndexByte(`\^$.|?*+()[]{}`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// RemoveAll deletes every key in the cluster (mooncake_store_remove_all
// without force), not only this client's, and returns how many it
// deleted. Keys under a read lease, or being read, are left and not
// counted, as by [Store.RemovePrefix].
func (s *Store) RemoveAll(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("mooncake: remove all: %w", err)
	}
	if err := s.lockCall("remove all"); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	n := s.lib.removeAll(s.handle, force)
	if n < 0 {
		return 0, fmt.Errorf("mooncake: remove all: %w", Error{Op: opAll, Code: int(n)})
	}
	return int(n), nil
}

// Leases reports the read leases of Mooncake Store as the binding uses
// it: Exists (batch_is_exist, and get_size for the sizes) and Get
// (batch_get_into) grant a lease on each key they find, for
// Config.LeaseTTL (the master's --default_kv_lease_ttl, which the C API
// cannot ask: [DefaultLeaseTTL] unless the config says otherwise; 0 for
// [NoLeaseTTL]); Remove waits up to Config.RemoveLeaseWait (0 for
// [NoRemoveWait]) for a lease to end, then fails with an error matching
// store.ErrHasLease; RemovePrefix and RemoveAll leave leased keys and, as
// the master reports only how many it removed, return a nil error. It
// implements [store.Leaser].
func (s *Store) Leases() store.Leases {
	return store.Leases{
		Exists:     true,
		Get:        true,
		TTL:        max(s.cfg.LeaseTTL, 0),
		RemoveWait: max(s.cfg.RemoveLeaseWait, 0),
	}
}

// Register registers r with the client (mooncake_store_register_buffer)
// so that puts and gets may use any part of it. The region must be
// non-empty, mapped host memory (checked), or device memory when
// Config.DeviceMemory is set, and must not overlap a registered region.
// Errors match store.ErrInvalidRegion. Register waits for calls in flight.
func (s *Store) Register(r rdma.Region) error {
	if r.Len <= 0 || r.Addr == 0 || r.End() < r.Addr {
		return fmt.Errorf("%w: mooncake: register {Addr: %#x, Len: %d}: empty or wrapping region", store.ErrInvalidRegion, r.Addr, r.Len)
	}
	if !r.Loc.IsHost() {
		if !s.cfg.DeviceMemory {
			return fmt.Errorf("%w: mooncake: register [%#x, +%d) on %s: device memory needs Config.DeviceMemory (a library built with accelerator support)",
				store.ErrInvalidRegion, r.Addr, r.Len, r.Loc)
		}
	} else if err := mapped.Check(r.Addr, r.Len); err != nil {
		return fmt.Errorf("%w: mooncake: register: %w", store.ErrInvalidRegion, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("mooncake: register: %w", store.ErrClosed)
	}
	at := 0
	for at < len(s.mu.regions) && s.mu.regions[at].Addr < r.Addr {
		at++
	}
	for _, o := range s.mu.regions[max(at-1, 0):min(at+1, len(s.mu.regions))] {
		if o.Addr < r.End() && r.Addr < o.End() {
			return fmt.Errorf("%w: mooncake: register [%#x, +%d): overlaps the registered [%#x, +%d)",
				store.ErrInvalidRegion, r.Addr, r.Len, o.Addr, o.Len)
		}
	}
	if rc := s.lib.registerBuffer(s.handle, r.Addr, uintptr(r.Len)); rc != 0 {
		return fmt.Errorf("mooncake: register [%#x, +%d): %w", r.Addr, r.Len, Error{Op: opRegister, Code: int(rc)})
	}
	s.mu.regions = append(s.mu.regions, rdma.Region{})
	copy(s.mu.regions[at+1:], s.mu.regions[at:])
	s.mu.regions[at] = r
	return nil
}

// Unregister undoes [Store.Register] for exactly the region registered.
// It waits for calls in flight.
func (s *Store) Unregister(r rdma.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("mooncake: unregister: %w", store.ErrClosed)
	}
	for i, o := range s.mu.regions {
		if o == r {
			if rc := s.lib.unregisterBuffer(s.handle, r.Addr); rc != 0 {
				return fmt.Errorf("mooncake: unregister [%#x, +%d): %w", r.Addr, r.Len, Error{Op: opUnreg, Code: int(rc)})
			}
			s.mu.regions = append(s.mu.regions[:i], s.mu.regions[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("%w: mooncake: unregister [%#x, +%d) on %s: not registered", store.ErrInvalidRegion, r.Addr, r.Len, r.Loc)
}

// Hostname returns the segment name of this client ("host:port"), the
// name other clients' Config.PreferredSegments use for it.
func (s *Store) Hostname() (string, error) {
	if err := s.lockCall("hostname"); err != nil {
		return "", err
	}
	defer s.mu.RUnlock()
	a, err := s.arenas.get(arenaMin)
	if err != nil {
		return "", err
	}
	defer s.arenas.put(a)
	if rc := s.lib.getHostname(s.handle, a.addr(0), uintptr(len(a.mem))); rc != 0 {
		return "", fmt.Errorf("mooncake: hostname: %w", Error{Op: "get hostname", Code: int(rc)})
	}
	n := bytes.IndexByte(a.mem, 0)
	if n < 0 {
		return "", fmt.Errorf("%w: mooncake: hostname: no NUL in %d bytes", store.ErrTransfer, len(a.mem))
	}
	return string(a.mem[:n]), nil
}

// HealthCheck asks the client whether it is connected
// (mooncake_store_health_check); nil means healthy.
func (s *Store) HealthCheck() error {
	if err := s.lockCall("health check"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if rc := s.lib.healthCheck(s.handle); rc != 0 {
		return fmt.Errorf("mooncake: health check: %w", Error{Op: "health check", Code: int(rc)})
	}
	return nil
}

// Stats returns the counters this client keeps in Go. Keys, Bytes,
// Capacity and Evictions are zero: the C API does not report them (the
// master's metrics do). Puts counts every successful put, including keys
// that were already in the store (the C API does not tell them apart);
// Duplicates counts keys repeated within one batch.
func (s *Store) Stats() store.Stats {
	return store.Stats{
		Hits:         s.stats.hits.Load(),
		Misses:       s.stats.misses.Load(),
		Exists:       s.stats.exists.Load(),
		Puts:         s.stats.puts.Load(),
		Duplicates:   s.stats.dups.Load(),
		RejectedPuts: s.stats.rejected.Load(),
		BytesIn:      s.stats.bytesIn.Load(),
		BytesOut:     s.stats.bytesOut.Load(),
	}
}

// Close waits for calls in flight, then destroys the client
// (mooncake_store_destroy, 0.2-2.5 s against a real cluster: it leaves the
// cluster and releases its segment, so values stored in it are gone) and
// releases its memory. The destroy runs on a fresh OS thread that is
// discarded afterwards, like the one that created the client. Close is
// idempotent; later calls of other methods return store.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil
	}
	s.mu.closed = true
	s.mu.regions = nil
	onNativeThread(func() { s.lib.destroy(s.handle) })
	s.arenas.close()
	unmapMem(s.persist)
	s.persist = nil
	s.log.Info("mooncake: client closed", "master", s.cfg.MasterServerAddress)
	return nil
}

// setupHint is the likely cause of a failed setup, from its code: Mooncake
// answers an unreachable master with INTERNAL (-1) after its retries, or
// with an RPC code, and parameters it refuses with INVALID_PARAMS.
func setupHint(err error) string {
	var e Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Code {
	case CodeInternal, CodeRPCFail, CodeRPCTimeout:
		return " (is the master up and reachable, and the protocol built into the library?)"
	case CodeInvalidParams:
		return " (Mooncake refused a parameter: global_segment_size, local_buffer_size, protocol, device_name or local_hostname)"
	}
	return ""
}
