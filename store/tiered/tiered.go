package tiered

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

var (
	_ store.Store    = (*Store)(nil)
	_ store.Vectored = (*Store)(nil)
	_ store.Leaser   = (*Store)(nil)
	_ store.Watcher  = (*Store)(nil)
	_ store.Layered  = (*Store)(nil)
)

// feedSize is the buffer of the feed the Store reads from each tier that
// is a store.Watcher; it drains them after each of its calls.
const feedSize = 1 << 14

// Store is a store made of tiers, top down. Make one with [New]; it is
// safe for concurrent use.
type Store struct {
	cfg    Config
	log    *slog.Logger
	tiers  []*tier
	sketch *sketch
	seed   maphash.Seed
	feeds  store.Feeds
	media  []string // the tiers' media, top first (store.Layered)
	pumpMu sync.Mutex
	leases store.Leases
	// filtered is whether some tier has an admission filter: only then
	// are uses counted.
	filtered bool

	// stripes serialise, per key, everything that writes or removes it in
	// any tier (puts, promotions, write-backs, removals), so that every
	// tier holding a key holds the same value, and a removed key does not
	// come back from a promotion or a write-back in flight.
	stripes [nStripes]sync.Mutex
	// changes counts, per stripe, the puts and removals of its keys,
	// under its lock: a Get takes the count of each key's stripe before
	// it reads, and promotes only keys whose stripe did not change since,
	// so that a value read before a removal and a new put does not come
	// back over the new one.
	changes [nStripes]atomic.Uint64
	// putting holds, for each key that a put is writing into the tiers
	// now, a channel that the put closes once it has written them (see
	// putsOf): a write-through put stores into the top tier first, and
	// the top tier may evict the key, or fail its read, before the put
	// reaches the tiers below; a Get or Exists that began while the put
	// was in flight and missed the key in every tier waits for the put
	// and looks again, so that it does not miss a key another reader may
	// have read already. n counts the keys held, so that calls look in m
	// only while some put is in flight.
	putting struct {
		n atomic.Int64
		m sync.Map // key → chan struct{}
	}

	life struct {
		sync.RWMutex
		closed bool
	}

	wb struct {
		mu      sync.Mutex
		queued  uint64        // keys queued, ever
		handled uint64        // keys the goroutine has done with
		changed chan struct{} // closed, and replaced, when handled grows
		ch      chan string
		cancel  context.CancelFunc
		done    chan struct{}
		staging *rdma.HostMemory
	}

	counters struct {
		hits, misses, exists, puts, dups, rejected, bytesIn, bytesOut atomic.Int64
	}
}

const nStripes = 256

// tier is one tier and its counters.
type tier struct {
	s      store.Store
	vec    store.Vectored // nil if the store is not Vectored
	medium string
	filter bool
	feed   *store.Feed // nil if the store is not a Watcher
	c      struct {
		hits, misses, promotions, demotions, filtered, dropped, errors atomic.Int64
	}
}

// New returns a store over cfg.Tiers, which it owns from then on (its
// Close closes them). With Config.WriteBack it starts the goroutine that
// copies values down; Close ends it.
func New(cfg Config) (*Store, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, log: cfg.Logger, sketch: newSketch(cfg.SketchWidth), seed: maphash.MakeSeed()}
	for _, t := range cfg.Tiers {
		x := &tier{s: t.Store, medium: t.Medium, filter: t.Filter}
		s.filtered = s.filtered || t.Filter
		x.vec, _ = t.Store.(store.Vectored)
		if w, ok := t.Store.(store.Watcher); ok {
			f, err := w.Watch(feedSize)
			if err != nil {
				s.closeFeeds()
				return nil, fmt.Errorf("tiered: watch tier %s: %w", t.Medium, err)
			}
			x.feed = f
		}
		if l, ok := t.Store.(store.Leaser); ok {
			tl := l.Leases()
			s.leases.Exists = s.leases.Exists || tl.Exists
			s.leases.Get = s.leases.Get || tl.Get
			s.leases.TTL = max(s.leases.TTL, tl.TTL)
			s.leases.RemoveWait += tl.RemoveWait
		}
		s.tiers = append(s.tiers, x)
		s.media = append(s.media, t.Medium)
	}
	if cfg.WriteBack && len(s.tiers) > 1 {
		mem, err := rdma.AllocHost(cfg.StagingBytes)
		if err != nil {
			s.closeFeeds()
			return nil, fmt.Errorf("tiered: write-back staging of %d bytes: %w", cfg.StagingBytes, err)
		}
		for i, t := range s.tiers {
			if err := t.s.Register(mem.Region()); err != nil {
				for _, u := range s.tiers[:i] {
					if uerr := u.s.Unregister(mem.Region()); uerr != nil {
						s.log.Warn("tiered: unregister staging", "tier", u.medium, "err", uerr)
					}
				}
				s.closeFeeds()
				return nil, errors.Join(fmt.Errorf("tiered: register write-back staging with tier %s: %w", t.medium, err), mem.Free())
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.wb.ch = make(chan string, cfg.WriteBackQueue)
		s.wb.cancel = cancel
		s.wb.done = make(chan struct{})
		s.wb.staging = mem
		s.wb.changed = make(chan struct{})
		go s.writeBack(ctx)
	}
	return s, nil
}

func (s *Store) closeFeeds() {
	for _, t := range s.tiers {
		if t.feed != nil {
			t.feed.Close()
		}
	}
}

func (s *Store) enter() error {
	s.life.RLock()
	if s.life.closed {
		s.life.RUnlock()
		return store.ErrClosed
	}
	return nil
}

// exit ends a call: it relays what the tiers reported meanwhile.
func (s *Store) exit() {
	s.pump()
	s.life.RUnlock()
}

func (s *Store) start(ctx context.Context, op string, keys, regions, res int) error {
	if err := store.CheckBatch(op, keys, regions, res); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.enter()
}

// pump relays the events of the tiers' feeds to the Store's, each with
// its tier's medium.
func (s *Store) pump() {
	s.pumpMu.Lock()
	defer s.pumpMu.Unlock()
	var buf []store.KeyEvent
	for _, t := range s.tiers {
		if t.feed == nil {
			continue
		}
		var lost int64
		buf, lost = t.feed.Take(buf[:0])
		for _, e := range buf {
			e.Medium = t.medium
			s.feeds.Announce(e)
		}
		s.feeds.Lose(lost)
	}
}

// announce reports an event of a tier that does not report its own.
func (s *Store) announce(t *tier, key string, op store.KeyOp) {
	if t.feed == nil {
		s.feeds.Announce(store.KeyEvent{Key: key, Op: op, Medium: t.medium})
	}
}

// stripeSet is a set of stripes, locked in ascending order.
type stripeSet [nStripes / 64]uint64

func (s *Store) stripe(key string) int { return int(maphash.String(s.seed, key) % nStripes) }

func (s *Store) lockKeys(keys []string, idx []int) *stripeSet {
	var set stripeSet
	for _, i := range idx {
		k := s.stripe(keys[i])
		set[k/64] |= 1 << (k % 64)
	}
	s.lockSet(&set)
	return &set
}

func (s *Store) lockAll() *stripeSet {
	var set stripeSet
	for i := range set {
		set[i] = ^uint64(0)
	}
	s.lockSet(&set)
	return &set
}

func (s *Store) lockSet(set *stripeSet) {
	for k := range nStripes {
		if set[k/64]&(1<<(k%64)) != 0 {
			s.stripes[k].Lock()
		}
	}
}

// changed counts a put or removal in every stripe of set, which the
// caller holds.
func (s *Store) changed(set *stripeSet) {
	for k := range nStripes {
		if set[k/64]&(1<<(k%64)) != 0 {
			s.changes[k].Add(1)
		}
	}
}

func (s *Store) unlock(set *stripeSet) {
	for k := nStripes - 1; k >= 0; k-- {
		if set[k/64]&(1<<(k%64)) != 0 {
			s.stripes[k].Unlock()
		}
	}
}

// putOf returns the channel of a put of key in flight now, or nil.
func (s *Store) putOf(key string) chan struct{} {
	if s.putting.n.Load() == 0 {
		return nil
	}
	if ch, ok := s.putting.m.Load(key); ok {
		return ch.(chan struct{})
	}
	return nil
}

// awaitPuts waits for the puts wait[i] of the keys of idx, and returns
// the keys whose put ended. If ctx ends first, the keys whose put had not
// ended get ctx's error in res.
func awaitPuts(ctx context.Context, idx []int, wait []chan struct{}, res []store.Result) []int {
	var done []int
	for j, i := range idx {
		select {
		case <-wait[i]:
			done = append(done, i)
		case <-ctx.Done():
			for _, i := range idx[j:] {
				res[i] = store.Result{Err: ctx.Err()}
			}
			return done
		}
	}
	return done
}

// final reports whether a per-key error of a tier ends the key's search:
// the caller's own error (a bad key or region, a short destination) or
// the context's. Any other error (absent, a failed transfer, a full tier)
// lets a lower tier try.
func isCtx(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func final(err error) bool {
	return errors.Is(err, store.ErrInvalidKey) || errors.Is(err, store.ErrInvalidRegion) ||
		errors.Is(err, store.ErrBufferTooSmall) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded)
}

// put calls the tier's Put, or PutV where a key has several regions.
func (t *tier) put(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	if one, ok := single(src); ok {
		return t.s.Put(ctx, keys, one, res)
	}
	if t.vec == nil {
		return fmt.Errorf("%w: tier %s takes one region per key", store.ErrInvalidRegion, t.medium)
	}
	return t.vec.PutV(ctx, keys, src, res)
}

// get calls the tier's Get, or GetV where a key has several regions.
func (t *tier) get(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	if one, ok := single(dst); ok {
		return t.s.Get(ctx, keys, one, res)
	}
	if t.vec == nil {
		return fmt.Errorf("%w: tier %s takes one region per key", store.ErrInvalidRegion, t.medium)
	}
	return t.vec.GetV(ctx, keys, dst, res)
}

// single returns the one region of each key, if every key has one.
func single(rs [][]rdma.Region) ([]rdma.Region, bool) {
	out := make([]rdma.Region, len(rs))
	for i, r := range rs {
		if len(r) != 1 {
			return nil, false
		}
		out[i] = r[0]
	}
	return out, true
}

func pick[T any](all []T, idx []int) []T {
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = all[i]
	}
	return out
}

// Exists looks each key up top down and stops at the first tier that has
// it: res[i].N is the size that tier reports. A tier that fails a key
// (or a whole call) lets the next tier try; the last tier's error stands.
// As in Get, a key that no tier had while a put of it was in flight is
// looked for again once the put ended.
func (s *Store) Exists(ctx context.Context, keys []string, res []store.Result) error {
	return s.exists(ctx, keys, res, nil)
}

// checkTiers refuses a batch whose tier slots are not one per key; the
// call it guards checks the rest of the batch.
func checkTiers(op string, keys, tier int) error {
	if tier != keys {
		return fmt.Errorf("store: %s: %d keys but %d tier slots", op, keys, tier)
	}
	return nil
}

// Media returns the media of the tiers, top first, as Config.Tiers names
// them. It implements [store.Layered].
func (s *Store) Media() []string { return s.media }

// ExistsTier is [Store.Exists], and writes into tier[i] the index in
// Config.Tiers of the tier that has keys[i], or -1. It implements
// [store.Layered].
func (s *Store) ExistsTier(ctx context.Context, keys []string, res []store.Result, tier []int) error {
	if err := checkTiers("exists", len(keys), len(tier)); err != nil {
		return err
	}
	return s.exists(ctx, keys, res, tier)
}

// GetTier is [Store.Get], and writes into tier[i] the index in
// Config.Tiers of the tier that served keys[i], or -1. It implements
// [store.Layered].
func (s *Store) GetTier(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result, tier []int) error {
	if err := checkTiers("get", len(keys), len(tier)); err != nil {
		return err
	}
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i : i+1] }, dst, res, tier)
}

// GetVTier is [Store.GetV], and writes into tier[i] the index in
// Config.Tiers of the tier that served keys[i], or -1. It implements
// [store.Layered].
func (s *Store) GetVTier(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result, tier []int) error {
	if err := checkTiers("get", len(keys), len(tier)); err != nil {
		return err
	}
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i] }, nil, res, tier)
}

// exists is Exists; tier, when not nil, receives each key's tier.
func (s *Store) exists(ctx context.Context, keys []string, res []store.Result, tier []int) error {
	if err := s.start(ctx, "exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	defer s.exit()
	for i := range tier {
		tier[i] = -1
	}
	var idx []int
	for i, k := range keys {
		if err := store.ValidateKey(k); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		idx = append(idx, i)
	}
	s.counters.exists.Add(int64(len(idx)))
	for _, i := range idx {
		res[i] = store.Result{Err: store.ErrNotFound}
	}
	at := s.lookup(ctx, keys, idx, res)
	if tier != nil {
		for j, i := range idx {
			tier[i] = at[j]
		}
	}
	return nil
}

// lookup runs Exists down the tiers for keys[idx], writing res, and
// returns per key (by position in idx) the tier that has it, or -1.
func (s *Store) lookup(ctx context.Context, keys []string, idx []int, res []store.Result) []int {
	at := make([]int, len(idx))
	for j := range at {
		at[j] = -1
	}
	wait := make([]chan struct{}, len(keys)) // each key's put in flight
	for _, i := range idx {
		wait[i] = s.putOf(keys[i])
	}
	left := make([]int, len(idx)) // positions in idx
	for j := range left {
		left[j] = j
	}
	left = s.lookupTiers(ctx, keys, idx, left, res, at)
	// As in a Get, a key that no tier had while a put of it was in flight
	// is looked for again once the put ended.
	var again []int
	for _, p := range left {
		if i := idx[p]; wait[i] != nil && errors.Is(res[i].Err, store.ErrNotFound) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		again = awaitPuts(ctx, again, wait, res)
		pos := make(map[int]int, len(idx)) // key index → position in idx
		for p, i := range idx {
			pos[i] = p
		}
		var ps []int
		for _, i := range again {
			res[i] = store.Result{Err: store.ErrNotFound}
			ps = append(ps, pos[i])
		}
		s.lookupTiers(ctx, keys, idx, ps, res, at)
	}
	return at
}

// lookupTiers runs Exists down the tiers for the keys keys[idx[p]] of
// the positions p of left, writing res and at, and returns the positions
// that no tier had.
func (s *Store) lookupTiers(ctx context.Context, keys []string, idx, left []int, res []store.Result, at []int) []int {
	for ti, t := range s.tiers {
		if len(left) == 0 {
			break
		}
		ks := make([]string, len(left))
		for j, p := range left {
			ks[j] = keys[idx[p]]
		}
		r := make([]store.Result, len(ks))
		if err := t.s.Exists(ctx, ks, r); err != nil {
			for j := range r {
				r[j] = store.Result{Err: err}
			}
		}
		var next []int
		for j, p := range left {
			i := idx[p]
			switch {
			case r[j].Err == nil:
				res[i] = r[j]
				at[p] = ti
			case final(r[j].Err):
				res[i] = r[j]
			default:
				res[i] = missed(res[i], t, r[j].Err)
				next = append(next, p)
			}
		}
		left = next
	}
	return left
}

// missed is the result of a key that tier t did not have: store.ErrNotFound,
// naming the first tier that failed it otherwise (prev holds the result so
// far, which is store.ErrNotFound itself until a tier fails).
func missed(prev store.Result, t *tier, err error) store.Result {
	if errors.Is(err, store.ErrNotFound) || prev.Err != nil && prev.Err != store.ErrNotFound {
		if prev.Err == nil {
			prev.Err = store.ErrNotFound
		}
		return store.Result{Err: prev.Err}
	}
	return store.Result{Err: fmt.Errorf("%w: tier %s failed: %v", store.ErrNotFound, t.medium, err)}
}

// Put stores each src[i] under keys[i]. A key present in any tier keeps
// its value (the put succeeds as a duplicate). Otherwise the value goes
// into the top tier and, with write-through (the default), into every
// lower tier that its filter admits, before Put returns; with
// Config.WriteBack, into the lower tiers later. The put of a key succeeds
// when some tier stored it; otherwise the top tier's error stands
// (store.ErrNoSpace when it is full, and the lower tiers were too).
// Per-key errors: store.ErrInvalidKey, store.ErrInvalidRegion,
// store.ErrNoSpace, and a tier's other errors.
func (s *Store) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i : i+1] }, res)
}

// PutV stores under keys[i] the concatenation of the regions src[i], as
// [Store.Put] stores one region. A tier that is not a store.Vectored
// takes keys of one region only. It implements [store.Vectored].
func (s *Store) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i] }, res)
}

func total(rs []rdma.Region) int {
	n := 0
	for _, r := range rs {
		n += r.Len
	}
	return n
}

func (s *Store) putBatch(ctx context.Context, keys []string, nsrc int, src func(i int) []rdma.Region, res []store.Result) error {
	if err := s.start(ctx, "put", len(keys), nsrc, len(res)); err != nil {
		return err
	}
	defer s.exit()
	var idx []int
	uses := make([]int, len(keys))
	for i, k := range keys {
		if err := store.ValidateKey(k); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if len(src(i)) == 0 {
			res[i] = store.Result{Err: fmt.Errorf("%w: put %.64q: no source regions", store.ErrInvalidRegion, k)}
			continue
		}
		idx = append(idx, i)
		if s.filtered {
			uses[i] = s.sketch.add(k)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	set := s.lockKeys(keys, idx)
	defer s.unlock(set)
	s.changed(set)

	// Which keys some tier holds already: those are duplicates.
	look := make([]store.Result, len(keys))
	for _, i := range idx {
		look[i] = store.Result{Err: store.ErrNotFound}
	}
	// (The stripes are held: no other put of these keys is in flight, and
	// a miss is a miss.)
	at := make([]int, len(idx))
	for j := range at {
		at[j] = -1
	}
	all := make([]int, len(idx))
	for j := range all {
		all[j] = j
	}
	s.lookupTiers(ctx, keys, idx, all, look, at)
	// A key named again in the batch is put from its first occurrence
	// only, so that no tier stores a later one (which one tier would, if
	// the first failed there, and another not).
	var todo, repeats []int
	firstOf := make(map[string]int)
	var dups int64
	for j, i := range idx {
		switch {
		case at[j] >= 0:
			res[i] = store.Result{N: total(src(i))}
			dups++
		case isCtx(look[i].Err):
			res[i] = look[i]
		default:
			if _, ok := firstOf[keys[i]]; ok {
				repeats = append(repeats, i)
				continue
			}
			firstOf[keys[i]] = i
			todo = append(todo, i)
		}
	}

	tried := slices.Clone(todo)
	// The keys' puts are in flight from here until every tier is written
	// (see putting).
	if len(tried) > 0 {
		chs := make([]chan struct{}, len(tried))
		s.putting.n.Add(int64(len(tried)))
		for j, i := range tried {
			chs[j] = make(chan struct{})
			s.putting.m.Store(keys[i], chs[j])
		}
		defer func() {
			for j, i := range tried {
				s.putting.m.Delete(keys[i])
				close(chs[j])
			}
			s.putting.n.Add(-int64(len(tried)))
		}()
	}
	stored := make([]bool, len(keys))
	errs := make([]error, len(keys))
	for ti, t := range s.tiers {
		if len(todo) == 0 || ti > 0 && s.cfg.WriteBack {
			break
		}
		var send []int
		for _, i := range todo {
			if t.filter && uses[i] < s.cfg.MinUses {
				t.c.filtered.Add(1)
				continue
			}
			send = append(send, i)
		}
		if len(send) == 0 {
			continue
		}
		ks := pick(keys, send)
		srcs := make([][]rdma.Region, len(send))
		for j, i := range send {
			srcs[j] = src(i)
		}
		r := make([]store.Result, len(send))
		tctx := ctx
		if ti > 0 {
			// Once the top tier has a key, the put goes through every
			// tier: one canceled half way would leave keys that only the
			// top tier holds.
			tctx = context.WithoutCancel(ctx)
		}
		if err := t.put(tctx, ks, srcs, r); err != nil {
			for j := range r {
				r[j] = store.Result{Err: err}
			}
		}
		var next []int
		for j, i := range send {
			switch {
			case r[j].Err == nil:
				s.announce(t, keys[i], store.KeyStored)
				if ti > 0 {
					t.c.demotions.Add(1)
				}
				stored[i] = true
				next = append(next, i)
			case final(r[j].Err):
				if errs[i] == nil || isCtx(r[j].Err) {
					errs[i] = r[j].Err
				}
			default:
				if errs[i] == nil {
					errs[i] = r[j].Err
				}
				next = append(next, i)
			}
		}
		// A key that failed for a bad region fails in every tier.
		todo = next
	}

	var puts, rejected, bytesIn int64
	for _, i := range repeats {
		f := firstOf[keys[i]]
		if stored[f] {
			res[i] = store.Result{N: total(src(i))}
			dups++
		} else {
			res[i] = store.Result{Err: errs[f]}
			if errors.Is(errs[f], store.ErrNoSpace) {
				rejected++
			}
		}
	}
	for _, i := range tried {
		switch {
		case stored[i]:
			res[i] = store.Result{N: total(src(i))}
			puts++
			bytesIn += int64(res[i].N)
			if s.cfg.WriteBack {
				s.queueWriteBack(keys[i])
			}
		case errs[i] != nil:
			res[i] = store.Result{Err: errs[i]}
			if errors.Is(errs[i], store.ErrNoSpace) {
				rejected++
			}
		}
	}
	s.counters.puts.Add(puts)
	s.counters.dups.Add(dups)
	s.counters.rejected.Add(rejected)
	s.counters.bytesIn.Add(bytesIn)
	return nil
}

// Get reads each key from the first tier, top down, that has it. A hit in
// a lower tier is promoted (unless Config.NoPromote): copied from dst[i]
// into the tiers above, before Get returns. A key that reaches
// Config.MinUses uses with this Get is copied down into the filtered
// tiers below the one it was found in. A tier that fails a key with an
// error other than the caller's own (store.ErrBufferTooSmall,
// store.ErrInvalidKey, store.ErrInvalidRegion) or the context's lets the
// next tier try; the last tier's error stands. A key that no tier had
// while a put of it was in flight is looked for again once that put has
// written every tier (or the call's context ended: its error stands for
// the key), so that a write-through put that has reached only the top
// tier, which then lost the key or failed its read, is not read as a
// miss. A tier that fails a key may have written into dst[i] before a
// lower tier's value is copied over it.
func (s *Store) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i : i+1] }, dst, res, nil)
}

// GetV reads the value of keys[i] across the regions dst[i], as
// [Store.Get] reads it into one. It implements [store.Vectored].
func (s *Store) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i] }, nil, res, nil)
}

// getBatch is Get and GetV: dst(i) is the regions of keys[i]; one, when
// not nil, holds them as one region per key (a Get). tier, when not nil,
// receives the tier that served each key, or -1.
func (s *Store) getBatch(ctx context.Context, keys []string, ndst int, dst func(i int) []rdma.Region, one []rdma.Region, res []store.Result, tier []int) error {
	if err := s.start(ctx, "get", len(keys), ndst, len(res)); err != nil {
		return err
	}
	defer s.exit()
	// The common case first: the top tier has every key of a Get. It is
	// asked for the batch as it came, and what it does not serve goes the
	// general way below, from its results.
	var pre []store.Result
	if one != nil && !s.filtered {
		if err := s.tiers[0].s.Get(ctx, keys, one, res); err == nil {
			var bytesOut int64
			for _, r := range res {
				if r.Err != nil {
					pre = slices.Clone(res)
					break
				}
				bytesOut += int64(r.N)
			}
			if pre == nil {
				for i := range tier {
					tier[i] = 0
				}
				n := int64(len(keys))
				s.tiers[0].c.hits.Add(n)
				s.counters.hits.Add(n)
				s.counters.bytesOut.Add(bytesOut)
				return nil
			}
		}
	}
	var left []int
	uses := make([]int, len(keys))
	for i, k := range keys {
		if err := store.ValidateKey(k); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if len(dst(i)) == 0 {
			res[i] = store.Result{Err: fmt.Errorf("%w: get %.64q: no destination regions", store.ErrInvalidRegion, k)}
			continue
		}
		left = append(left, i)
		if s.filtered {
			uses[i] = s.sketch.add(k)
		}
	}
	at := make([]int, len(keys))
	seen := make([]uint64, len(keys))        // each key's stripe's changes before the reads
	wait := make([]chan struct{}, len(keys)) // and its put in flight
	for _, i := range left {
		res[i] = store.Result{Err: store.ErrNotFound}
		seen[i] = s.changes[s.stripe(keys[i])].Load()
		wait[i] = s.putOf(keys[i])
	}
	read := func(left []int, pre []store.Result) {
		for ti, t := range s.tiers {
			if len(left) == 0 {
				break
			}
			r := make([]store.Result, len(left))
			if ti == 0 && pre != nil {
				for j, i := range left {
					r[j] = pre[i]
				}
			} else {
				ks := pick(keys, left)
				ds := make([][]rdma.Region, len(left))
				for j, i := range left {
					ds[j] = dst(i)
				}
				if err := t.get(ctx, ks, ds, r); err != nil {
					for j := range r {
						r[j] = store.Result{Err: err}
					}
				}
			}
			var next []int
			for j, i := range left {
				switch {
				case r[j].Err == nil:
					res[i] = r[j]
					at[i] = ti
					t.c.hits.Add(1)
				case final(r[j].Err):
					res[i] = r[j]
				default:
					t.c.misses.Add(1)
					res[i] = missed(res[i], t, r[j].Err)
					next = append(next, i)
				}
			}
			left = next
		}
	}
	read(left, pre)
	// A key that no tier had while a put of it was in flight is looked
	// for again once the put ended (see putting).
	var again []int
	for _, i := range left {
		if wait[i] != nil && errors.Is(res[i].Err, store.ErrNotFound) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		again = awaitPuts(ctx, again, wait, res)
		for _, i := range again {
			res[i] = store.Result{Err: store.ErrNotFound}
		}
		read(again, nil)
	}
	var hits, misses, bytesOut int64
	var moved []int
	for i := range keys {
		switch {
		case res[i].Err == nil:
			hits++
			bytesOut += int64(res[i].N)
			if at[i] > 0 && !s.cfg.NoPromote || uses[i] == s.cfg.MinUses && s.filteredBelow(at[i]) {
				moved = append(moved, i)
			}
		case errors.Is(res[i].Err, store.ErrNotFound):
			misses++
		}
	}
	s.counters.hits.Add(hits)
	s.counters.misses.Add(misses)
	s.counters.bytesOut.Add(bytesOut)
	for i := range tier {
		tier[i] = -1
		if res[i].Err == nil {
			tier[i] = at[i]
		}
	}
	if len(moved) > 0 {
		s.move(ctx, keys, moved, at, uses, seen, func(i int) [][]rdma.Region {
			return [][]rdma.Region{trim(dst(i), res[i].N)}
		})
	}
	return nil
}

func (s *Store) filteredBelow(ti int) bool {
	for _, t := range s.tiers[ti+1:] {
		if t.filter {
			return true
		}
	}
	return false
}

// trim returns the prefix of the regions rs that holds n bytes.
func trim(rs []rdma.Region, n int) []rdma.Region {
	var out []rdma.Region
	for _, r := range rs {
		if n == 0 {
			break
		}
		r.Len = min(r.Len, n)
		n -= r.Len
		out = append(out, r)
	}
	return out
}

// move copies the values of keys[idx], which a Get read from tier at[i]
// into the caller's memory (val), up into the tiers above (promotion) and
// down into the filtered tiers below that the key's uses now admit. It
// holds the keys' stripes and moves only keys whose stripe saw no put or
// removal since the Get's reads began (seen), and that are still in the
// tier they were read from, so that a key removed meanwhile does not come
// back, nor an old value over a new one. Failures are counted in the
// tiers' Errors, not reported: the Get has its value.
func (s *Store) move(ctx context.Context, keys []string, idx []int, at, uses []int, seen []uint64, val func(i int) [][]rdma.Region) {
	set := s.lockKeys(keys, idx)
	defer s.unlock(set)
	idx = slices.DeleteFunc(slices.Clone(idx), func(i int) bool { return s.changes[s.stripe(keys[i])].Load() != seen[i] })
	for ti, t := range s.tiers {
		var send []int
		var up []bool
		for _, i := range idx {
			switch {
			case ti < at[i] && !s.cfg.NoPromote && (!t.filter || uses[i] >= s.cfg.MinUses):
				send, up = append(send, i), append(up, true)
			case ti > at[i] && t.filter && uses[i] == s.cfg.MinUses:
				send, up = append(send, i), append(up, false)
			}
		}
		if len(send) == 0 {
			continue
		}
		// Still there? Ask each key's own tier, one call per tier.
		there := make([]bool, len(send))
		for src := range s.tiers {
			var ks []string
			var js []int
			for j, i := range send {
				if at[i] == src {
					ks, js = append(ks, keys[i]), append(js, j)
				}
			}
			if len(ks) == 0 {
				continue
			}
			r := make([]store.Result, len(ks))
			if err := s.tiers[src].s.Exists(ctx, ks, r); err != nil {
				continue
			}
			for k, j := range js {
				there[j] = r[k].Err == nil
			}
		}
		var keep []int
		var keepUp []bool
		for j, i := range send {
			if there[j] {
				keep, keepUp = append(keep, i), append(keepUp, up[j])
			}
		}
		if len(keep) == 0 {
			continue
		}
		ks := pick(keys, keep)
		srcs := make([][]rdma.Region, len(keep))
		for j, i := range keep {
			srcs[j] = val(i)[0]
		}
		r := make([]store.Result, len(keep))
		err := t.put(ctx, ks, srcs, r)
		for j := range keep {
			e := err
			if e == nil {
				e = r[j].Err
			}
			switch {
			case e != nil:
				t.c.errors.Add(1)
				s.log.Debug("tiered: copy between tiers failed", "key", ks[j], "tier", t.medium, "err", e)
			case keepUp[j]:
				t.c.promotions.Add(1)
				s.announce(t, ks[j], store.KeyStored)
			default:
				t.c.demotions.Add(1)
				s.announce(t, ks[j], store.KeyStored)
			}
		}
	}
}

// Remove deletes key from every tier. It returns nil when some tier held
// it, store.ErrNotFound when none did, and the first other error of a
// tier (such as store.ErrHasLease) otherwise: the key may then stay in
// that tier.
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
	set := s.lockKeys([]string{key}, []int{0})
	defer s.unlock(set)
	s.changed(set)
	// Once begun, a removal goes through every tier: one canceled half
	// way would leave the key readable from the tiers it did not reach.
	ctx = context.WithoutCancel(ctx)
	found := false
	var errs []error
	for _, t := range s.tiers {
		err := t.s.Remove(ctx, key)
		switch {
		case err == nil:
			found = true
			s.announce(t, key, store.KeyRemoved)
		case errors.Is(err, store.ErrNotFound):
		default:
			errs = append(errs, fmt.Errorf("tiered: remove from tier %s: %w", t.medium, err))
		}
	}
	switch {
	case len(errs) > 0:
		return errors.Join(errs...)
	case !found:
		return store.ErrNotFound
	}
	return nil
}

// RemovePrefix deletes every key that starts with prefix from every tier.
// It returns the most keys that one tier deleted: the exact count of keys
// when one tier held every key (the bottom one, with write-through and no
// filter), a lower bound otherwise. It holds off every put and removal
// while it runs.
func (s *Store) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := store.ValidateKey(prefix); err != nil {
		return 0, fmt.Errorf("tiered: remove prefix: %w", err)
	}
	ctx = context.WithoutCancel(ctx) // see Remove
	return s.removeAll(func(t store.Store) (int, error) { return t.RemovePrefix(ctx, prefix) })
}

// RemoveAll deletes every key from every tier, and returns a count as
// RemovePrefix does.
func (s *Store) RemoveAll(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ctx = context.WithoutCancel(ctx) // see Remove
	return s.removeAll(func(t store.Store) (int, error) { return t.RemoveAll(ctx) })
}

func (s *Store) removeAll(rm func(store.Store) (int, error)) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	set := s.lockAll()
	defer s.unlock(set)
	s.changed(set)
	most := 0
	var errs []error
	for _, t := range s.tiers {
		n, err := rm(t.s)
		most = max(most, n)
		if err != nil {
			errs = append(errs, fmt.Errorf("tiered: tier %s: %w", t.medium, err))
		}
	}
	return most, errors.Join(errs...)
}

// Register registers r with every tier; if one refuses it, those that
// took it unregister it again and the error names the tier.
func (s *Store) Register(r rdma.Region) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.life.RUnlock()
	for i, t := range s.tiers {
		if err := t.s.Register(r); err != nil {
			var undo []error
			for _, u := range s.tiers[:i] {
				if uerr := u.s.Unregister(r); uerr != nil {
					undo = append(undo, uerr)
				}
			}
			return errors.Join(append([]error{fmt.Errorf("tiered: register with tier %s: %w", t.medium, err)}, undo...)...)
		}
	}
	return nil
}

// Unregister unregisters r from every tier.
func (s *Store) Unregister(r rdma.Region) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.life.RUnlock()
	var errs []error
	for _, t := range s.tiers {
		if err := t.s.Unregister(r); err != nil {
			errs = append(errs, fmt.Errorf("tiered: unregister from tier %s: %w", t.medium, err))
		}
	}
	return errors.Join(errs...)
}

// Stats returns the Store's own counters of hits, misses, exists, puts,
// duplicates, rejected puts and bytes, which are exact; Keys, Bytes and
// Capacity are those of the tier that holds the most keys, and Evictions
// the sum of the tiers' (a key leaving a tier counts once per tier). Per
// tier figures are in [Store.Tiers].
func (s *Store) Stats() store.Stats {
	st := store.Stats{
		Hits:         s.counters.hits.Load(),
		Misses:       s.counters.misses.Load(),
		Exists:       s.counters.exists.Load(),
		Puts:         s.counters.puts.Load(),
		Duplicates:   s.counters.dups.Load(),
		RejectedPuts: s.counters.rejected.Load(),
		BytesIn:      s.counters.bytesIn.Load(),
		BytesOut:     s.counters.bytesOut.Load(),
	}
	for _, t := range s.tiers {
		ts := t.s.Stats()
		if ts.Keys >= st.Keys {
			st.Keys, st.Bytes, st.Capacity = ts.Keys, ts.Bytes, ts.Capacity
		}
		st.Evictions += ts.Evictions
	}
	return st
}

// TierStats are the figures of one tier.
type TierStats struct {
	Medium     string
	Hits       int64       // keys a Get of the Store found in this tier
	Misses     int64       // keys a Get asked this tier for and it did not serve
	Promotions int64       // keys copied into this tier from a tier below
	Demotions  int64       // keys copied into this tier from above: write-through, write-back, copy-down
	Filtered   int64       // keys the admission filter kept off this tier
	Dropped    int64       // keys write-back did not copy here (queue full, value too large)
	Errors     int64       // copies into this tier that failed
	Store      store.Stats // the tier's own Stats: keys, bytes, evictions
}

// Tiers returns the figures of each tier, top first.
func (s *Store) Tiers() []TierStats {
	out := make([]TierStats, len(s.tiers))
	for i, t := range s.tiers {
		out[i] = TierStats{
			Medium:     t.medium,
			Hits:       t.c.hits.Load(),
			Misses:     t.c.misses.Load(),
			Promotions: t.c.promotions.Load(),
			Demotions:  t.c.demotions.Load(),
			Filtered:   t.c.filtered.Load(),
			Dropped:    t.c.dropped.Load(),
			Errors:     t.c.errors.Load(),
			Store:      t.s.Stats(),
		}
	}
	return out
}

// Leases describes the union of the tiers' leases: a call grants one if
// it does in some tier, for the longest TTL, and a removal may wait for
// each tier's RemoveWait in turn. It implements [store.Leaser].
func (s *Store) Leases() store.Leases { return s.leases }

// Watch starts a feed of the keys that reach or leave each tier, with
// the tier's medium: what the tiers that are store.Watchers report
// (stored, evicted, removed), and, for a tier that is not, the keys the
// Store put into it or removed from it (its evictions cannot be seen). A
// tier's events are relayed at the end of each call of the Store. It
// implements [store.Watcher].
func (s *Store) Watch(n int) (*store.Feed, error) {
	if err := s.enter(); err != nil {
		return nil, fmt.Errorf("tiered: watch: %w", err)
	}
	defer s.life.RUnlock()
	return s.feeds.Watch(n)
}

// Close waits for the calls in flight, stops write-back (keys still
// queued are not copied), and closes every tier. Later calls return
// store.ErrClosed; Close is idempotent.
func (s *Store) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return nil
	}
	s.life.closed = true
	var errs []error
	if s.wb.ch != nil {
		s.wb.cancel()
		close(s.wb.ch)
		<-s.wb.done
		for _, t := range s.tiers {
			if err := t.s.Unregister(s.wb.staging.Region()); err != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, s.wb.staging.Free())
	}
	s.pump()
	s.feeds.Close()
	s.closeFeeds()
	for _, t := range s.tiers {
		if err := t.s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("tiered: close tier %s: %w", t.medium, err))
		}
	}
	return errors.Join(errs...)
}

// queueWriteBack queues key for the write-back goroutine, or counts it
// dropped when the queue is full.
func (s *Store) queueWriteBack(key string) {
	s.wb.mu.Lock()
	defer s.wb.mu.Unlock()
	select {
	case s.wb.ch <- key:
		s.wb.queued++
	default:
		for _, t := range s.tiers[1:] {
			t.c.dropped.Add(1)
		}
	}
}

// writeBack copies queued keys from the top tier into the lower ones
// through the staging memory, one at a time, under the key's stripe.
func (s *Store) writeBack(ctx context.Context) {
	defer close(s.wb.done)
	stage := s.wb.staging.Region()
	for key := range s.wb.ch {
		s.copyDown(ctx, stage, key)
		s.wb.mu.Lock()
		s.wb.handled++
		close(s.wb.changed)
		s.wb.changed = make(chan struct{})
		s.wb.mu.Unlock()
	}
}

// Flush waits until the write-back goroutine has done with every key
// queued before the call (copied it down, or found it gone), or ctx is
// done. Without Config.WriteBack it returns at once.
func (s *Store) Flush(ctx context.Context) error {
	if s.wb.ch == nil {
		return nil
	}
	s.wb.mu.Lock()
	target := s.wb.queued
	s.wb.mu.Unlock()
	for {
		s.wb.mu.Lock()
		done, changed := s.wb.handled >= target, s.wb.changed
		s.wb.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// copyDown copies key from the top tier into the lower ones through
// stage, under the key's stripe.
func (s *Store) copyDown(ctx context.Context, stage rdma.Region, key string) {
	if ctx.Err() != nil {
		return
	}
	set := s.lockKeys([]string{key}, []int{0})
	r := []store.Result{{}}
	err := s.tiers[0].s.Get(ctx, []string{key}, []rdma.Region{stage}, r)
	if err == nil {
		err = r[0].Err
	}
	if err != nil {
		// Gone from the top tier already, or too large for staging.
		if !errors.Is(err, store.ErrNotFound) {
			for _, t := range s.tiers[1:] {
				t.c.dropped.Add(1)
			}
		}
		s.unlock(set)
		return
	}
	val := stage
	val.Len = r[0].N
	uses := s.sketch.estimate(key)
	for _, t := range s.tiers[1:] {
		if t.filter && uses < s.cfg.MinUses {
			t.c.filtered.Add(1)
			continue
		}
		pr := []store.Result{{}}
		err := t.s.Put(ctx, []string{key}, []rdma.Region{val}, pr)
		if err == nil {
			err = pr[0].Err
		}
		if err != nil {
			t.c.errors.Add(1)
			s.log.Debug("tiered: write-back failed", "key", key, "tier", t.medium, "err", err)
			continue
		}
		t.c.demotions.Add(1)
		s.announce(t, key, store.KeyStored)
	}
	s.unlock(set)
	s.pump()
}
