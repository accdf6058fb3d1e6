package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// bug is a deliberate defect of refStore, to prove that Run catches it.
type bug int

const (
	noBug                      bug = iota
	bugServesAfterRemove           // Remove reports success and keeps the key
	bugLastWriterWins              // a second put replaces the value
	bugEvictsDuringRead            // Get evicts and poisons the value half way through its copy
	bugAcceptsSpaces               // keys with spaces are accepted
	bugIgnoresMismatch             // batch slices of different lengths are served up to the shortest
	bugWritesShortBuffer           // a too-short destination is written before ErrBufferTooSmall
	bugVanishes                    // every fifth put silently drops the oldest key
	bugOpenAfterClose              // Close does not close
	bugPrefixMiscount              // RemovePrefix reports one key more than it removed
	bugIgnoresContext              // canceled contexts are ignored
	bugRetainsSource               // Put keeps the source region and Get reads it then
	bugWritesPastValue             // Get zeroes the destination past the value
	bugStatsOffByOne               // Stats counts one key too many
	bugRepeatLastWins              // a key repeated within a Put keeps its last occurrence's bytes
	bugRepeatFillsLast             // a key repeated within a Get fills only its last destination (as Mooncake's batch_get_into)
	bugTornUnderRemoval            // a Get overlapping a removal copies the rest of its value from another key's memory
	bugForeignUnderRemoval         // a Get overlapping a removal returns another key's value, whose put reused the memory
	bugLeaseRefusalLies            // Remove reports store.ErrHasLease but removes the key
	bugTruncatesKeys               // keys are cut to their first 250 bytes (memcached's limit)
	bugFoldsCase                   // keys are compared without regard to case
	bugPrefixRegex                 // RemovePrefix matches "^" + prefix as a regular expression
	bugPrefixGlob                  // RemovePrefix matches prefix + "*" as a glob pattern
	bugPrefixContains              // RemovePrefix removes the keys that contain prefix
	bugIgnoresDeadline             // a context whose deadline has passed is ignored (only cancellation is seen)
	bugCancelClaimsSuccess         // the keys a batch canceled part-way did not do report success
	bugCancelAsMiss                // the keys a get or exists canceled part-way did not do report store.ErrNotFound
	bugCancelMiscounts             // RemovePrefix and RemoveAll canceled part-way report 0 keys removed
	bugAcceptsDevice               // device regions are taken for host memory
	bugRegisterMissesStart         // Register misses an overlap with a region that starts before a registered one
	bugRegisteredStartOnly         // with registration required, a region is taken if its first byte is registered
	bugRegisteredEndOnly           // with registration required, a region is taken if its last byte is registered
	bugRequiresRegistration        // unregistered host regions are refused, although the store does not say it needs registration
	bugCountsShortAsHit            // a get into too short a destination counts as a hit
	bugCountsShortAsMiss           // a get into too short a destination counts as a miss
	bugCountsRoomAsBytesOut        // BytesOut counts the destination's length, not the value's
	bugCountsFoundExists           // Exists counts only the keys it found
	bugCountsPresentAsPut          // a put of a present key counts in Puts (as Mooncake's C API cannot tell them apart)
	bugMissesRepeatDuplicate       // a key repeated within a put batch does not count as a duplicate
	bugCountsDuplicateBytesIn      // BytesIn counts the bytes of duplicates too
	bugCountsPresentAsRejected     // a put of a present key counts as rejected (OBJECT_ALREADY_EXISTS taken for a refusal)
	bugStaleAfterEviction          // an evicted key stays readable by Get, stale, though Exists reports it absent
	bugEvictedAliases              // an evicted key's entry is left pointing at the memory of the put that evicted it
	bugNeverCountsEvictions        // Stats().Evictions stays zero
	bugNeverEvicts                 // the store says it evicts, at Options.Capacity, but holds everything
	bugDuplicateHeldSize           // a put of a present key reports the size of the value the key holds as N, not its source's length
	bugDuplicateZero               // a put of a present key reports N 0, as it stores nothing
	bugShortReportsSize            // a get into too short a destination reports the value's size as N beside store.ErrBufferTooSmall
	bugUndeclaredLeases            // Exists and Get lease keys for an hour, but the store's Leases declare none
	bugUnheldLeases                // the store's Leases declare hour-long leases on Exists and Get, but it grants none
	bugLeaseOutlivesTTL            // the store's Leases declare leases of 100 ms, but they last an hour
	bugWrapsPastMiB                // a value's bytes past 1 MiB are its first bytes again (a chunk index that wraps)
	bugBatchCap256                 // a put batch stores its first 256 keys and reports the rest stored too
	bugReputRevives                // a put of a removed key brings back the value it held before the removal
	bugWatchMissesPrefix           // (watching) RemovePrefix and RemoveAll announce nothing
	bugWatchAbsent                 // (watching) Remove of an absent key announces it removed
	bugWatchTwice                  // (watching) Remove announces the key removed twice
	bugWatchAfterClose             // (watching) Watch after Close returns a feed
	bugRemoveAllIgnoresLeases      // the store's Leases declare hour-long leases on Exists and Get, and RemoveAll takes leased keys all the same
	bugExistsIgnoresExpiry         // (expiring) Exists finds keys whose time to live has passed
	bugGetIgnoresExpiry            // (expiring) Get serves keys whose time to live has passed
	bugExpiredKeepsOut             // (expiring) a put of an expired key finds it present and keeps the old value, which has expired
	bugExpiredCounted              // (expiring) RemovePrefix and RemoveAll count expired keys among those they removed
	bugExpiryAsRemoved             // (expiring, watching) an expired key is announced store.KeyRemoved
	bugExpiryOnlyOnCall            // (expiring, watching) a key is expired, and announced, only when a call finds it
	bugCtxOnlyAtStart              // a batch looks at its context when it starts, and not between keys
	bugCloseDetached               // Close returns without waiting for the calls in flight, and a get admitted while it ran copies its values again after it returned (as a copy engine retries)
)

// watchingStore is a refStore that implements store.Watcher: it
// announces the keys removals take, and those evictions drop.
type watchingStore struct{ *refStore }

func (w watchingStore) Watch(n int) (*store.Feed, error) {
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed && w.bug != bugWatchAfterClose {
		return nil, fmt.Errorf("refstore: watch: %w", store.ErrClosed)
	}
	return w.feeds.Watch(n)
}

// announce tells the feeds, if the store is watched, that k left by op.
func (s *refStore) announce(k string, op store.KeyOp) {
	if s.feeds != nil {
		s.feeds.Announce(store.KeyEvent{Key: k, Op: op})
	}
}

// leasesOf returns the leases a refStore with bug b grants, and those it
// declares through store.Leaser, if it implements it.
func leasesOf(b bug) (grants store.Leases, declares *store.Leases) {
	hour := store.Leases{Exists: true, Get: true, TTL: time.Hour}
	switch b {
	case bugUndeclaredLeases:
		return hour, &store.Leases{}
	case bugUnheldLeases:
		return store.Leases{}, &hour
	case bugRemoveAllIgnoresLeases:
		return hour, &hour
	case bugLeaseOutlivesTTL:
		short := hour
		short.TTL = 100 * time.Millisecond
		return hour, &short
	}
	return store.Leases{}, nil
}

// refStore is a simple, correct store on the Go heap, one mutex around
// everything, with an optional FIFO eviction, optional read leases and an
// optional bug.
type refStore struct {
	bug      bug
	feeds    *store.Feeds // not nil: the store implements store.Watcher (watchingStore)
	capacity int          // bytes; 0: no eviction
	needsReg bool         // Put and Get take only regions inside registered ones
	// grants are the read leases the store grants (Remove fails at once
	// under one; RemovePrefix and RemoveAll skip such keys and say so),
	// declares those its Leases method declares, if store returns a
	// store.Leaser.
	grants   store.Leases
	declares *store.Leases
	leased   map[string]time.Time // when each lease ends

	mu     sync.Mutex
	m      map[string][]byte
	src    map[string]rdma.Region // bugRetainsSource
	order  []string               // insertion order, for eviction
	used   int
	puts   int
	st     store.Stats // the cumulative counters
	regs   []rdma.Region
	closed bool

	stale    map[string][]byte // evicted values Get still serves (bugStaleAfterEviction)
	alias    map[string]string // evicted key -> the key whose put took its memory (bugEvictedAliases)
	removals atomic.Int64      // removal calls so far (bugTornUnderRemoval, bugForeignUnderRemoval)
	getEpoch atomic.Int64      // removals as the previous get saw them
	lastPut  string            // the key stored last
	gone     map[string][]byte // the last value of each key dropped

	// ttl, when not zero, is the time to live of every key put: a key
	// expires ttl after the put that stored it, when a call finds it, and
	// in a watched store also by a reaper (every expiryTick), which Close
	// stops.
	ttl     time.Duration
	expires map[string]time.Time

	// bugCloseDetached: a Close has started, it has returned, and the gets
	// admitted since it started.
	closing, detached atomic.Bool
	lateGets          atomic.Int64
	reaper            struct {
		stop chan struct{}
		wg   sync.WaitGroup
	}
}

// expiryTick is how often the reaper of a watched refStore with a time to
// live looks for expired keys.
const expiryTick = 5 * time.Millisecond

// newExpiringStore returns a refStore with bug b whose keys expire ttl
// after their put; watched, it implements store.Watcher and its reaper
// expires keys nobody asks for (but with bugExpiryOnlyOnCall).
func newExpiringStore(b bug, ttl time.Duration, watched bool) store.Store {
	s := newRefStore(b, 0)
	s.ttl = ttl
	if !watched {
		return s.store()
	}
	s.feeds = new(store.Feeds)
	if b != bugExpiryOnlyOnCall {
		stop := make(chan struct{})
		s.reaper.stop = stop
		s.reaper.wg.Go(func() {
			tick := time.NewTicker(expiryTick)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				s.mu.Lock()
				for k := range s.expires {
					s.expire(k)
				}
				s.mu.Unlock()
			}
		})
	}
	return s.store()
}

// expire drops k, and announces it expired, if its time to live has
// passed; it reports whether it did. The caller holds s.mu.
func (s *refStore) expire(k string) bool {
	end, ok := s.expires[k]
	if !ok || time.Now().Before(end) {
		return false
	}
	s.drop(k)
	op := store.KeyExpired
	if s.bug == bugExpiryAsRemoved {
		op = store.KeyRemoved
	}
	s.announce(k, op)
	return true
}

var _ store.Store = (*refStore)(nil)

func newRefStore(b bug, capacity int) *refStore {
	s := &refStore{bug: b, capacity: capacity, m: map[string][]byte{}, src: map[string]rdma.Region{}, gone: map[string][]byte{},
		stale: map[string][]byte{}, alias: map[string]string{}, leased: map[string]time.Time{}, expires: map[string]time.Time{}}
	s.grants, s.declares = leasesOf(b)
	return s
}

// leasingStore is a refStore that implements store.Leaser.
type leasingStore struct{ *refStore }

var _ store.Leaser = leasingStore{}

func (s leasingStore) Leases() store.Leases { return *s.declares }

// store returns s, as a store.Leaser when it declares its leases.
func (s *refStore) store() store.Store {
	if s.feeds != nil {
		return watchingStore{s}
	}
	if s.declares != nil {
		return leasingStore{s}
	}
	return s
}

// lease grants k a read lease, if the store grants one on the call
// (Exists or Get). The caller holds s.mu.
func (s *refStore) lease(onCall bool, k string) {
	if onCall && s.grants.TTL > 0 {
		s.leased[k] = time.Now().Add(s.grants.TTL)
	}
}

// isLeased reports whether k is under a read lease. The caller holds s.mu.
func (s *refStore) isLeased(k string) bool {
	end, ok := s.leased[k]
	if ok && !time.Now().Before(end) {
		delete(s.leased, k)
		return false
	}
	return ok
}

func (s *refStore) validKey(k string) error {
	if s.bug == bugAcceptsSpaces {
		k = strings.ReplaceAll(k, " ", "_")
	}
	return store.ValidateKey(k)
}

// index returns the key under which the map holds k: k itself, but for
// the bugs that conflate keys.
func (s *refStore) index(k string) string {
	switch {
	case s.bug == bugTruncatesKeys && len(k) > 250:
		return k[:250]
	case s.bug == bugFoldsCase:
		return strings.ToLower(k)
	}
	return k
}

func validRegion(r rdma.Region) error {
	if r.Len <= 0 || r.Addr == 0 || r.Loc != rdma.Host {
		return fmt.Errorf("%w: %+v", store.ErrInvalidRegion, r)
	}
	return nil
}

// usable reports why r cannot be the source or destination of a put or a
// get, or nil. The caller holds s.mu.
func (s *refStore) usable(r rdma.Region) error {
	if s.bug == bugAcceptsDevice && r.Len > 0 && r.Addr != 0 {
		r.Loc = rdma.Host
	}
	if err := validRegion(r); err != nil {
		return err
	}
	if !s.needsReg && s.bug != bugRequiresRegistration {
		return nil
	}
	for _, x := range s.regs {
		switch {
		case s.bug == bugRegisteredStartOnly && r.Addr >= x.Addr && r.Addr < x.End(),
			s.bug == bugRegisteredEndOnly && r.End()-1 >= x.Addr && r.End() <= x.End(),
			x.Contains(r):
			return nil
		}
	}
	return fmt.Errorf("%w: %+v is not inside a registered region", store.ErrInvalidRegion, r)
}

func (s *refStore) begin(ctx context.Context, op string, keys, regions, res int) error {
	if s.bug != bugIgnoresMismatch {
		if err := store.CheckBatch(op, keys, regions, res); err != nil {
			return err
		}
	}
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	if s.closed || s.detached.Load() {
		return store.ErrClosed
	}
	return nil
}

// closeDetached is Close with bugCloseDetached: it returns once a get has
// been admitted since it started, without waiting for it.
func (s *refStore) closeDetached() error {
	s.closing.Store(true)
	until(func() bool { return s.lateGets.Load() > 0 })
	s.detached.Store(true)
	return nil
}

// until waits for cond, a minute at most.
func until(cond func() bool) {
	for end := time.Now().Add(time.Minute); !cond() && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// copyAfterClose is the end of a get with bugCloseDetached admitted while
// a Close ran: it waits for that Close to return and for a destination of
// the keys read to change (the caller reuses it), and copies the values
// into them again. The caller holds s.mu.
func (s *refStore) copyAfterClose(dst []rdma.Region, vals [][]byte) {
	until(s.detached.Load)
	until(func() bool {
		for i, v := range vals {
			if v != nil && !bytes.Equal(dst[i].Bytes()[:len(v)], v) {
				return true
			}
		}
		return false
	})
	for i, v := range vals {
		if v != nil {
			copy(dst[i].Bytes(), v)
		}
	}
}

// ctxErr is ctx.Err(), as the store sees it: checked when a call starts
// and between the keys of a batch.
func (s *refStore) ctxErr(ctx context.Context) error {
	err := ctx.Err()
	switch {
	case s.bug == bugIgnoresContext:
		return nil
	case s.bug == bugIgnoresDeadline && errors.Is(err, context.DeadlineExceeded):
		return nil
	}
	return err
}

// keyCtxErr is ctx.Err(), as the store sees it between the keys of a
// batch.
func (s *refStore) keyCtxErr(ctx context.Context) error {
	if s.bug == bugCtxOnlyAtStart {
		return nil
	}
	return s.ctxErr(ctx)
}

// canceled fills the results of the keys a batch did not do because ctx
// was done with err: claim(i) is what bugCancelClaimsSuccess claims for
// key i, and miss says whether bugCancelAsMiss applies.
func (s *refStore) canceled(res []store.Result, err error, miss bool, claim func(i int) int) {
	for i := range res {
		switch {
		case s.bug == bugCancelClaimsSuccess:
			res[i] = store.Result{N: claim(i)}
		case s.bug == bugCancelAsMiss && miss:
			res[i] = store.Result{Err: store.ErrNotFound}
		default:
			res[i] = store.Result{Err: err}
		}
	}
}

func batchLen(keys int, others ...int) int {
	for _, o := range others {
		keys = min(keys, o)
	}
	return keys
}

func (s *refStore) Exists(ctx context.Context, keys []string, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	n := batchLen(len(keys), len(res))
	for i := range n {
		if err := s.keyCtxErr(ctx); err != nil {
			s.canceled(res[i:n], err, true, func(int) int { return 0 })
			break
		}
		if err := s.validKey(keys[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if s.bug != bugCountsFoundExists {
			s.st.Exists++
		}
		if s.bug != bugExistsIgnoresExpiry {
			s.expire(s.index(keys[i]))
		}
		v, ok := s.m[s.index(keys[i])]
		if !ok && s.bug == bugEvictedAliases {
			v, ok = s.evicted(s.index(keys[i]))
		}
		if ok {
			res[i] = store.Result{N: len(v)}
			s.lease(s.grants.Exists, s.index(keys[i]))
			if s.bug == bugCountsFoundExists {
				s.st.Exists++
			}
		} else {
			res[i] = store.Result{Err: store.ErrNotFound}
		}
	}
	return nil
}

func (s *refStore) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	inBatch := map[string]bool{}
	n := batchLen(len(keys), len(src), len(res))
	for i := range n {
		if err := s.keyCtxErr(ctx); err != nil {
			s.canceled(res[i:n], err, false, func(j int) int { return src[i+j].Len })
			break
		}
		k := s.index(keys[i])
		if err := s.validKey(keys[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if err := s.usable(src[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if s.bug == bugBatchCap256 && i >= 256 {
			res[i] = store.Result{N: src[i].Len}
			continue
		}
		again := inBatch[k]
		inBatch[k] = true
		if s.bug != bugExpiredKeepsOut {
			s.expire(k)
		}
		if v, ok := s.m[k]; ok && s.bug != bugLastWriterWins && !(again && s.bug == bugRepeatLastWins) {
			switch s.bug {
			case bugDuplicateHeldSize:
				res[i] = store.Result{N: len(v)}
			case bugDuplicateZero:
				res[i] = store.Result{}
			default:
				res[i] = store.Result{N: src[i].Len}
			}
			s.countDuplicate(src[i].Len, again)
			continue
		}
		if s.capacity > 0 {
			if src[i].Len > s.capacity {
				res[i] = store.Result{Err: store.ErrNoSpace}
				s.st.RejectedPuts++
				continue
			}
			for s.used+src[i].Len > s.capacity {
				victim := s.order[0]
				v := s.m[victim]
				s.drop(victim)
				s.announce(victim, store.KeyEvicted)
				if s.bug != bugNeverCountsEvictions {
					s.st.Evictions++
				}
				switch s.bug {
				case bugStaleAfterEviction:
					s.stale[victim] = v
				case bugEvictedAliases:
					s.alias[victim] = k
				}
			}
		}
		s.st.Puts++
		s.st.BytesIn += int64(src[i].Len)
		s.puts++
		if s.bug == bugVanishes && s.puts%5 == 0 && len(s.order) > 0 {
			s.drop(s.order[0])
		}
		if old, ok := s.m[k]; ok {
			s.used -= len(old)
			s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == k })
		}
		s.m[k] = slices.Clone(src[i].Bytes())
		if s.ttl > 0 {
			s.expires[k] = time.Now().Add(s.ttl)
		}
		if old, ok := s.gone[k]; ok && s.bug == bugReputRevives && old != nil {
			s.m[k] = old
			s.used += len(old) - src[i].Len
		}
		if s.bug == bugWrapsPastMiB {
			v := s.m[k]
			for j := 1 << 20; j < len(v); j++ {
				v[j] = v[j-1<<20]
			}
		}
		delete(s.stale, k)
		delete(s.alias, k)
		s.src[k] = src[i]
		s.lastPut = k
		s.order = append(s.order, k)
		s.used += src[i].Len
		res[i] = store.Result{N: src[i].Len}
	}
	return nil
}

// evicted returns what the bugs that keep evicted keys serve for k.
func (s *refStore) evicted(k string) ([]byte, bool) {
	if v, ok := s.stale[k]; ok {
		return v, true
	}
	if p, ok := s.alias[k]; ok {
		v, ok := s.m[p]
		return v, ok
	}
	return nil, false
}

// countDuplicate counts a put of n bytes of a present key; again: a
// repeat of a key stored earlier in the batch.
func (s *refStore) countDuplicate(n int, again bool) {
	switch {
	case s.bug == bugCountsPresentAsPut:
		s.st.Puts++
		s.st.BytesIn += int64(n)
	case s.bug == bugMissesRepeatDuplicate && again:
	case s.bug == bugCountsPresentAsRejected:
		s.st.RejectedPuts++
		s.st.Duplicates++
	default:
		s.st.Duplicates++
	}
	if s.bug == bugCountsDuplicateBytesIn {
		s.st.BytesIn += int64(n)
	}
}

// countGet counts the outcome of a get of one key into room bytes.
func (s *refStore) countGet(r store.Result, room int) {
	switch {
	case r.Err == nil:
		s.st.Hits++
		s.st.BytesOut += int64(r.N)
		if s.bug == bugCountsRoomAsBytesOut {
			s.st.BytesOut += int64(room - r.N)
		}
	case errors.Is(r.Err, store.ErrNotFound):
		s.st.Misses++
	case errors.Is(r.Err, store.ErrBufferTooSmall) && s.bug == bugCountsShortAsHit:
		s.st.Hits++
	case errors.Is(r.Err, store.ErrBufferTooSmall) && s.bug == bugCountsShortAsMiss:
		s.st.Misses++
	}
}

func (s *refStore) drop(k string) {
	delete(s.leased, k)
	delete(s.expires, k)
	s.gone[k] = s.m[k]
	s.used -= len(s.m[k])
	delete(s.m, k)
	delete(s.src, k)
	s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == k })
}

func (s *refStore) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	n := batchLen(len(keys), len(dst), len(res))
	var read [][]byte // the values read, with bugCloseDetached during a Close
	if s.bug == bugCloseDetached && s.closing.Load() {
		read = make([][]byte, n)
		defer s.copyAfterClose(dst, read)
		s.lateGets.Add(1)
	}
	for i := range n {
		if err := s.keyCtxErr(ctx); err != nil {
			s.canceled(res[i:n], err, true, func(j int) int { return len(s.m[s.index(keys[i+j])]) })
			break
		}
		k := s.index(keys[i])
		if err := s.validKey(keys[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if err := s.usable(dst[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if s.bug != bugGetIgnoresExpiry {
			s.expire(k)
		}
		v, ok := s.m[k]
		if !ok {
			v, ok = s.evicted(k)
		}
		if ok && s.bug == bugRepeatFillsLast && len(v) <= dst[i].Len && slices.Contains(keys[i+1:n], k) {
			res[i] = store.Result{N: len(v)} // a later occurrence gets the bytes
			continue
		}
		if !ok {
			res[i] = store.Result{Err: store.ErrNotFound}
			continue
		}
		if s.bug == bugRetainsSource {
			v = s.src[k].Bytes()
		}
		b := dst[i].Bytes()
		if len(v) > len(b) {
			if s.bug == bugWritesShortBuffer {
				copy(b, v)
			}
			res[i] = store.Result{Err: fmt.Errorf("%w: %d > %d", store.ErrBufferTooSmall, len(v), len(b))}
			if s.bug == bugShortReportsSize {
				res[i].N = len(v)
			}
			continue
		}
		half := len(v) / 2
		copy(b, v[:half])
		if s.bug == bugEvictsDuringRead {
			s.drop(k)
			clear(v)
		}
		if s.bug == bugTornUnderRemoval || s.bug == bugForeignUnderRemoval {
			v = s.underRemoval(k, v)
			if s.bug == bugForeignUnderRemoval {
				copy(b, v[:half])
			}
		}
		copy(b[half:], v[half:])
		if s.bug == bugWritesPastValue {
			clear(b[len(v):])
		}
		res[i] = store.Result{N: len(v)}
		s.lease(s.grants.Get, k)
		if read != nil {
			read[i] = v
		}
	}
	for i := range n {
		s.countGet(res[i], dst[i].Len)
	}
	return nil
}

// underRemoval is the copy of a value, half done, when memory is not held
// for reads: if a removal ran since the store's previous get (as one does,
// all the time, while a remover runs beside the readers), the rest of the
// copy comes from another key's value of the same size (the last put,
// another present key or one removed before), as if memory had been
// reused. It waits for nothing: whether a removal ran is counted, not
// timed. The caller holds s.mu.
func (s *refStore) underRemoval(key string, v []byte) []byte {
	epoch := s.removals.Load()
	if s.getEpoch.Swap(epoch) == epoch {
		return v
	}
	if o, ok := s.m[s.lastPut]; ok && s.lastPut != key && len(o) == len(v) {
		return o
	}
	for _, m := range []map[string][]byte{s.m, s.gone} {
		for k, o := range m {
			if k != key && len(o) == len(v) {
				return o
			}
		}
	}
	return value("storetest: reused", 1, len(v))
}

func (s *refStore) Remove(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removals.Add(1)
	if err := s.begin(ctx, "remove", 0, -1, 0); err != nil {
		return err
	}
	if err := s.validKey(key); err != nil {
		return err
	}
	key = s.index(key)
	s.expire(key)
	if _, ok := s.m[key]; !ok {
		if s.bug == bugWatchAbsent {
			s.announce(key, store.KeyRemoved)
		}
		return store.ErrNotFound
	}
	if s.isLeased(key) {
		return fmt.Errorf("%w: %q", store.ErrHasLease, key)
	}
	if s.bug != bugServesAfterRemove {
		s.drop(key)
		s.announce(key, store.KeyRemoved)
		if s.bug == bugWatchTwice {
			s.announce(key, store.KeyRemoved)
		}
	}
	if s.bug == bugLeaseRefusalLies {
		return fmt.Errorf("%w: %q", store.ErrHasLease, key)
	}
	return nil
}

func (s *refStore) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if prefix == "" {
		return 0, fmt.Errorf("%w: empty prefix", store.ErrInvalidKey)
	}
	match := func(k string) bool { return strings.HasPrefix(k, prefix) }
	switch s.bug {
	case bugPrefixRegex:
		re, err := regexp.Compile("^" + prefix)
		if err != nil {
			return 0, err
		}
		match = re.MatchString
	case bugPrefixGlob:
		if _, err := path.Match(prefix+"*", ""); err != nil {
			return 0, err
		}
		match = func(k string) bool { ok, _ := path.Match(prefix+"*", k); return ok }
	case bugPrefixContains:
		match = func(k string) bool { return strings.Contains(k, prefix) }
	}
	return s.removeIf(ctx, match, false)
}

func (s *refStore) RemoveAll(ctx context.Context) (int, error) {
	return s.removeIf(ctx, func(string) bool { return true }, s.bug == bugRemoveAllIgnoresLeases)
}

// removeIf removes the keys that match, but for those under a lease,
// unless ignoreLeases.
func (s *refStore) removeIf(ctx context.Context, match func(string) bool, ignoreLeases bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removals.Add(1)
	if err := s.begin(ctx, "remove", 0, -1, 0); err != nil {
		return 0, err
	}
	n, left := 0, 0
	for k := range s.m {
		if err := s.keyCtxErr(ctx); err != nil {
			if s.bug == bugCancelMiscounts {
				n = 0
			}
			return n, err
		}
		if match(k) && s.bug != bugExpiredCounted && s.expire(k) {
			continue
		}
		switch {
		case !match(k):
		case s.isLeased(k) && !ignoreLeases:
			left++
		default:
			s.drop(k)
			if s.bug != bugWatchMissesPrefix {
				s.announce(k, store.KeyRemoved)
			}
			n++
		}
	}
	if s.bug == bugPrefixMiscount && n > 0 {
		n++
	}
	if left > 0 {
		return n, fmt.Errorf("%w: %d keys left under a lease", store.ErrHasLease, left)
	}
	return n, nil
}

func (s *refStore) Register(r rdma.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	if s.bug == bugAcceptsDevice && r.Len > 0 && r.Addr != 0 {
		r.Loc = rdma.Host
	}
	if err := validRegion(r); err != nil {
		return err
	}
	for _, x := range s.regs {
		overlap := r.Addr < x.End() && x.Addr < r.End()
		if s.bug == bugRegisterMissesStart { // r's start inside x, or r around x
			overlap = r.Addr >= x.Addr && r.Addr < x.End() || r.Addr <= x.Addr && r.End() >= x.End()
		}
		if overlap {
			return fmt.Errorf("%w: %+v overlaps %+v", store.ErrInvalidRegion, r, x)
		}
	}
	s.regs = append(s.regs, r)
	return nil
}

func (s *refStore) Unregister(r rdma.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	i := slices.Index(s.regs, r)
	if i < 0 {
		return fmt.Errorf("%w: %+v not registered", store.ErrInvalidRegion, r)
	}
	s.regs = slices.Delete(s.regs, i, i+1)
	return nil
}

func (s *refStore) Stats() store.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Keys, st.Bytes, st.Capacity = int64(len(s.m)), int64(s.used), int64(s.capacity)
	if s.bug == bugStatsOffByOne {
		st.Keys++
	}
	return st
}

func (s *refStore) Close() error {
	if s.bug == bugCloseDetached {
		return s.closeDetached()
	}
	s.mu.Lock()
	if stop := s.reaper.stop; stop != nil {
		s.reaper.stop = nil
		close(stop)
		s.mu.Unlock()
		s.reaper.wg.Wait()
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.bug != bugOpenAfterClose {
		s.closed = true
		if s.feeds != nil && s.bug != bugWatchAfterClose {
			s.feeds.Close()
		}
	}
	return nil
}

// vbug is a deliberate defect of vecStore's PutV or GetV.
type vbug int

const (
	noVBug              vbug = iota
	vbugReversed             // PutV gathers the regions in reverse order
	vbugWritesTooSmall       // GetV writes the regions before it finds them too small
	vbugEmptyIsValue         // an empty region list is a value of no bytes
	vbugFirstRegionOnly      // GetV fills only the first region and reports the whole size
	vbugContiguous           // PutV and GetV treat the regions as one span from the first one's address
)

// vecStore is a refStore that implements store.Vectored, by gathering
// into and scattering from a value on the Go heap, with an optional bug.
type vecStore struct {
	*refStore
	vbug vbug
}

var _ store.Vectored = (*vecStore)(nil)

func newVecStore(b vbug) *vecStore { return &vecStore{refStore: newRefStore(noBug, 0), vbug: b} }

// check validates one key's region list; it returns the total length.
func (s *vecStore) check(k string, rs []rdma.Region) (int, error) {
	if err := s.validKey(k); err != nil {
		return 0, err
	}
	if len(rs) == 0 && s.vbug != vbugEmptyIsValue {
		return 0, fmt.Errorf("%w: no regions", store.ErrInvalidRegion)
	}
	n := 0
	for _, r := range rs {
		if err := validRegion(r); err != nil {
			return 0, err
		}
		n += r.Len
	}
	return n, nil
}

func (s *vecStore) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	for i, k := range keys {
		if err := s.ctxErr(ctx); err != nil {
			s.canceled(res[i:], err, false, func(int) int { return 0 })
			break
		}
		n, err := s.check(k, src[i])
		if err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if _, ok := s.m[k]; ok {
			res[i] = store.Result{N: n}
			s.countDuplicate(n, false)
			continue
		}
		s.st.Puts++
		s.st.BytesIn += int64(n)
		var v []byte
		switch rs := src[i]; {
		case s.vbug == vbugContiguous && len(rs) > 0:
			v = slices.Clone(rdma.Region{Addr: rs[0].Addr, Len: n, Loc: rdma.Host}.Bytes())
		case s.vbug == vbugReversed:
			for j := len(rs) - 1; j >= 0; j-- {
				v = append(v, rs[j].Bytes()...)
			}
		default:
			for _, r := range rs {
				v = append(v, r.Bytes()...)
			}
		}
		s.m[k] = v
		s.order = append(s.order, k)
		s.used += len(v)
		res[i] = store.Result{N: n}
	}
	return nil
}

func (s *vecStore) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	for i, k := range keys {
		if err := s.ctxErr(ctx); err != nil {
			s.canceled(res[i:], err, true, func(int) int { return 0 })
			break
		}
		room, err := s.check(k, dst[i])
		if err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		v, ok := s.m[k]
		if !ok {
			res[i] = store.Result{Err: store.ErrNotFound}
			continue
		}
		if len(v) > room && s.vbug != vbugWritesTooSmall {
			res[i] = store.Result{Err: store.ErrBufferTooSmall}
			continue
		}
		rest := v
		for j, r := range dst[i] {
			if s.vbug == vbugContiguous {
				r = rdma.Region{Addr: dst[i][0].Addr, Len: min(len(v), room), Loc: rdma.Host}
			}
			rest = rest[copy(r.Bytes(), rest):]
			if s.vbug == vbugFirstRegionOnly || s.vbug == vbugContiguous || j == 0 && len(rest) == 0 {
				break
			}
		}
		if len(v) > room {
			res[i] = store.Result{Err: store.ErrBufferTooSmall}
			continue
		}
		res[i] = store.Result{N: len(v)}
	}
	for i := range res {
		room := 0
		for _, r := range dst[i] {
			room += r.Len
		}
		s.countGet(res[i], room)
	}
	return nil
}
