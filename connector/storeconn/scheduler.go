package storeconn

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/connector"

	"github.com/kvconnect/kvconnect/connector/driver"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
)

// Planner is the scheduler half of the store connector. It implements
// connector.Planner, connector.Rotator, connector.EventSource and
// connector.StatsReporter.
type Planner struct {
	cfg      connector.Config
	opt      options
	st       store.Store
	log      *slog.Logger
	id       hashing.Identity
	ns       hashing.Namespace
	bs       int             // tokens per block
	shards   int             // distinct KV shards (TP size / replication)
	groups   []hashing.Group // the KV cache groups, explicit
	plain    bool            // one full-attention group: a match is the present prefix
	perBlock int             // keys a lookup probes per block: every chunk of every shard of every group
	chunks   [][]chunk       // per group: the values a block is stored as (layer_chunks)

	// connector.Waker: wake holds a value once the engine should call
	// again; timer sends one when a pending lookup may have reached its
	// deadline (see waitLookup), armed while it runs.
	wake   chan struct{}
	wakeMu struct {
		sync.Mutex
		closed bool // wake is closed (Close): signal sends nothing
	}
	timer *time.Timer
	armed atomic.Bool

	reqs        map[connector.RequestID]*request
	transfers   *driver.Tally[*transfer]
	saving      map[groupHash]int // blocks with a save in flight, this generation
	retries     []retry           // out-of-space saves to plan again
	nextID      uint64
	plans       driver.PlanBuffer   // Plan hands out one Metadata while the next fills
	meta        *connector.Metadata // the one filling: this step's plan
	progress    connector.Progress
	events      []connector.KVEvent
	held        map[groupHash][]connector.KVEvent // BlockStored events waiting for the save of their parent, by parent
	w           *watch                            // the store's key events; nil when it is no store.Watcher or the half saves nothing
	released    []connector.RequestID
	stats       connector.Stats
	syncScratch probeScratch        // for lookups run inside Match
	blocks      []int               // per group, the engine's pool size (Env.Blocks, Env.GroupBlocks); 0 if unknown
	h           health              // store calls that failed
	failed      failedKeys          // blocks whose loads failed lately: not planned again for a while
	pending     int                 // lookups handed to the pool and not yet collected
	lastDone    time.Time           // when the pool last handed a lookup back, or began to owe one
	seen        []connector.BlockID // checkBlocks' scratch

	// Lookups run on a pool of goroutines; results come back through mu.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	jobs   chan *lookup
	mu     struct {
		sync.Mutex
		done []*lookup
	}
	closed bool

	// With prefill_tokens_per_s, per tier of the store (one unless it is
	// a store.Layered): the tokens per second of the loads of late from
	// that tier (a moving average from plan to end; 0 before the first),
	// and the matches held back since the last that was let through.
	tiers    tierInfo
	loadRate []float64
	slowHeld []int
	decided  []int8 // per tier, during fastEnd: undecided, tierFast or tierHeld
	gating   bool   // during fastEnd: blocks of held tiers count as absent
}

var (
	_ connector.HealthReporter  = (*Planner)(nil)
	_ connector.Planner         = (*Planner)(nil)
	_ connector.Rotator         = (*Planner)(nil)
	_ connector.EventSource     = (*Planner)(nil)
	_ connector.Waker           = (*Planner)(nil)
	_ connector.StatsReporter   = (*Planner)(nil)
	_ connector.UnsavedReporter = (*Planner)(nil)
	_ connector.Namespacer      = (*Planner)(nil)
)

// groupHash names one block of one KV cache group.
type groupHash struct {
	g int
	h hashing.BlockHash
}

// request is the scheduler half's state of one request. Block indices
// count blocks of Layout.BlockSize tokens, the block size of every group.
type request struct {
	id       connector.RequestID
	lk       *lookup // the latest lookup; nil before the first Match
	from     int     // first block the engine had locally at Match
	matchEnd int     // the block the last Match's answer ended at: Allocated may load up to it
	saveNext []int   // per group: first block not yet considered for saving
	noSave   []int   // per group: blocks before this were computed under an older generation
	inflight int     // transfers (planned or running) that touch its blocks
	retries  int     // out-of-space retries waiting to be planned
	finished bool    // Finish was called while transfers ran
	loads    int     // load transfers planned or running, one per group that loads
	// held is, per group other than full attention, its block table as
	// the engine last passed it: the engine frees sliding-window blocks
	// (and may drop states) while the request runs, so an out-of-space
	// retry goes out only for blocks still there. Nil with one group.
	held     [][]connector.BlockID
	loadEnd  int // the block boundary those loads resume at
	loadFail int // blocks valid after the failures of those loads so far; -1 while none failed
	loadFrom int // the local blocks when those loads were planned: all that survives a failed hybrid load
	// deferred are the saves of blocks the request computed in the step
	// of its load (a layer-wise engine), held until every worker reported
	// the load; deferNext is saveNext once they are planned.
	deferred  []retry
	deferNext []int
	deferStep uint64 // the step whose Metadata carries the load: only its Update may confirm the deferred saves
}

// lookup is one batch exists probe for a request, run by the pool.
type lookup struct {
	req    connector.RequestID
	gen    uint64
	from   int                 // first block probed
	hashes []hashing.BlockHash // blocks probed, from `from` on
	ns     hashing.Namespace
	groups int
	// Results, written by the pool before it hands the lookup back under
	// Planner.mu; read by the scheduler only once done is set.
	picked atomic.Int64 // when a pool goroutine took it up, in UnixNano; 0 while queued
	has    [][]bool     // per group, per block from `from`: present in every shard
	tier   [][]int      // per group, per block from `from`, with a store.Layered: the lowest tier holding a key of it; nil otherwise
	all    bool         // every probed block of every group is present
	err    error
	nanos  int64
	done   bool // set by the scheduler's goroutine when it collects the lookup
}

// transfer is a planned or running load or save.
type transfer struct {
	req     *request
	load    bool
	group   int
	gen     uint64
	first   int
	blocks  []connector.BlockID
	hashes  []hashing.BlockHash
	failAt  int    // lowest failed block index over all workers, -1 if none
	noSpace []bool // per block: a worker reported no space (saves)
	failed  []bool // per block: failed for another reason (saves)
	tries   int
	planned time.Time // a load, with prefill_tokens_per_s: when Allocated planned it
	tier    int       // a load: the lowest tier its lookup found a block of it in, whose load rate it measures
	// For a save, for its BlockStored events: the hash of the block
	// before first (zero for the request's first block), and the tokens
	// of its blocks when the engine gave them (Request.Tokens).
	prev   hashing.BlockHash
	tokens []hashing.Token
}

type retry struct {
	req    *request
	group  int
	first  int
	blocks []connector.BlockID
	hashes []hashing.BlockHash
	tries  int
	after  uint64 // the step from which it may be planned
	prev   hashing.BlockHash
	tokens []hashing.Token
	// deferred: the first try of a save held back while the request's
	// load ran (deferSaves), not a retry.
	deferred bool
}

func openPlanner(cfg connector.Config, env connector.Env) (*Planner, error) {
	opt, ns, log, err := open(cfg, env)
	if err != nil {
		return nil, err
	}
	s := &Planner{
		cfg:       cfg,
		opt:       opt,
		st:        env.Store,
		log:       log,
		id:        env.Identity,
		ns:        ns,
		bs:        env.Identity.Layout.BlockSize,
		shards:    ns.Shards(),
		groups:    ns.Groups(),
		reqs:      make(map[connector.RequestID]*request),
		transfers: driver.NewTally[*transfer](env.Identity.Layout.TPSize),
		saving:    make(map[groupHash]int),
		h:         health{log: log},
		failed:    failedKeys{m: make(map[groupHash]time.Time)},
		wake:      make(chan struct{}, 1),
	}
	s.tiers = tiersOf(env.Store)
	s.loadRate = make([]float64, s.tiers.n)
	s.slowHeld = make([]int, s.tiers.n)
	s.decided = make([]int8, s.tiers.n)
	for g, spec := range s.groups {
		if spec.BlockSize != s.bs {
			return nil, fmt.Errorf("%w: %s: Layout.Groups[%d].BlockSize = %d: this connector needs every group's block size to equal Layout.BlockSize = %d", connector.ErrConfig, Name, g, spec.BlockSize, s.bs)
		}
	}
	s.plain = len(s.groups) == 1 && s.groups[0].Kind == hashing.FullAttention
	s.chunks = chunksOf(s.groups, opt.layerChunks)
	for g := range s.groups {
		s.perBlock += ns.GroupShards(g) * len(s.chunks[g])
	}
	if env.Blocks < 0 {
		return nil, fmt.Errorf("%w: Env.Blocks = %d, want >= 0", connector.ErrConfig, env.Blocks)
	}
	s.blocks = make([]int, len(s.groups))
	for g := range s.blocks {
		s.blocks[g] = env.Blocks
	}
	if env.GroupBlocks != nil {
		if len(env.GroupBlocks) != len(s.groups) {
			return nil, fmt.Errorf("%w: Env.GroupBlocks has %d entries, want one per KV cache group: %d", connector.ErrConfig, len(env.GroupBlocks), len(s.groups))
		}
		for g, n := range env.GroupBlocks {
			if n < 0 {
				return nil, fmt.Errorf("%w: Env.GroupBlocks[%d] = %d, want >= 0", connector.ErrConfig, g, n)
			}
			s.blocks[g] = n
		}
	}
	s.meta = s.plans.Filling()
	s.meta.Generation = env.Identity.Generation
	if cfg.Role.CanSave() {
		if s.w, err = openWatch(env.Store, opt.watchBuffer); err != nil {
			return nil, fmt.Errorf("storeconn: watch the store: %w", err)
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if !opt.syncLookup {
		s.jobs = make(chan *lookup, opt.lookupQueue)
		for range opt.lookupWorkers {
			s.wg.Add(1)
			go s.lookupLoop()
		}
	}
	return s, nil
}

func (s *Planner) lookupLoop() {
	defer s.wg.Done()
	var sc probeScratch
	var batch []*lookup
	for {
		select {
		case <-s.ctx.Done():
			return
		case lk := <-s.jobs:
			// Every lookup queued behind this one joins its store call,
			// up to lookupBatchKeys keys: over a store whose calls are
			// round trips, a step's lookups cost one call, not one each.
			batch = append(batch[:0], lk)
			keys := len(lk.hashes) * s.perBlock
		drain:
			for keys < lookupBatchKeys {
				select {
				case more := <-s.jobs:
					batch = append(batch, more)
					keys += len(more.hashes) * s.perBlock
				default:
					break drain
				}
			}
			now := time.Now().UnixNano()
			for _, lk := range batch {
				lk.picked.Store(now)
			}
			s.probe(batch, &sc)
			s.mu.Lock()
			s.mu.done = append(s.mu.done, batch...)
			s.mu.Unlock()
			clear(batch)
			s.signal()
		}
	}
}

// lookupBatchKeys is how many keys a lookup goroutine gathers at most into
// one Exists call from the lookups queued behind the one it took up (a
// single lookup of more keys is never split).
const lookupBatchKeys = 4096

// probeScratch is reusable space for probes.
type probeScratch struct {
	kb   keyBuf
	keys []string
	res  []store.Result
	tier []int // with a store.Layered and prefill_tokens_per_s: each key's tier
}

// probe runs one batch exists over every shard of every probed block of
// the lookups lks and records, for each, the longest prefix present in all
// of them. A failed call fails every lookup of the batch.
func (s *Planner) probe(lks []*lookup, sc *probeScratch) {
	start := time.Now()
	sc.kb.reset()
	for _, lk := range lks {
		for g := range lk.groups {
			shards := lk.ns.GroupShards(g)
			cs := s.chunks[g]
			for _, h := range lk.hashes {
				for sh := 0; sh < shards; sh++ {
					for c := range cs {
						sc.kb.addChunk(lk.ns, g, sh, h, cs, c)
					}
				}
			}
		}
	}
	keys := sc.kb.keys(sc.keys[:0])
	res := grow(sc.res, len(keys))
	sc.keys, sc.res = keys, res
	ctx, cancel := context.WithTimeout(s.ctx, s.opt.storeTimeout)
	err := s.exists(ctx, sc)
	cancel()
	if err != nil {
		s.h.record("exists", err)
	} else {
		s.h.record("exists", firstKeyFailure(res))
	}
	nanos := time.Since(start).Nanoseconds()
	k := 0
	for i, lk := range lks {
		if i == 0 { // the call is counted once in Stats.LookupNanos
			lk.nanos = nanos
		}
		if err != nil {
			lk.err = err
			continue
		}
		s.noteTiers(lk, sc, k)
		lk.has = make([][]bool, lk.groups)
		lk.all = true
		for g := range lk.groups {
			n := lk.ns.GroupShards(g) * len(s.chunks[g]) // every chunk of every shard
			has := make([]bool, len(lk.hashes))
			for b := range lk.hashes {
				has[b] = true
				for _, r := range res[k : k+n] {
					if r.Err != nil {
						has[b] = false
					}
				}
				k += n
				lk.all = lk.all && has[b]
			}
			lk.has[g] = has
		}
	}
	clear(keys) // drop the batch's string
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// collect takes the lookups the pool finished since the last call.
func (s *Planner) collect() {
	s.mu.Lock()
	done := s.mu.done
	s.mu.done = nil
	s.mu.Unlock()
	if len(done) > 0 {
		s.lastDone = time.Now()
	}
	for _, lk := range done {
		lk.done = true
		s.pending--
		s.stats.LookupNanos += lk.nanos
	}
}

// waitLookup is Match's answer while a lookup runs or waits for the pool. It
// arms the wake-up timer: within the store timeout from now the lookup
// has answered (and signalled) or passed its deadline, where Match
// answers a miss, for a deadline runs from when the pool took the lookup
// up or, queued behind a stuck pool, from its last answer, both before
// now.
func (s *Planner) waitLookup() connector.Match {
	if !s.armed.Swap(true) {
		if s.timer == nil {
			s.timer = time.AfterFunc(s.opt.storeTimeout, s.fire)
		} else {
			s.timer.Reset(s.opt.storeTimeout)
		}
	}
	return connector.Match{Pending: true}
}

func (s *Planner) fire() {
	s.armed.Store(false)
	s.signal()
}

// signal tells a waiting engine to call again (connector.Waker).
func (s *Planner) signal() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.wakeMu.closed {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Wake implements connector.Waker: a value arrives once a lookup answered
// or may have passed its deadline, and after an Update that leaves
// out-of-space retries waiting for a later step. Close closes the channel.
func (s *Planner) Wake() <-chan struct{} { return s.wake }

// stuck reports whether the pool has owed a lookup for longer than the
// store timeout: the store hangs, ignoring its deadlines. New lookups then
// answer a miss at once instead of joining the queue.
func (s *Planner) stuck(now time.Time) bool {
	return s.pending > 0 && now.Sub(s.lastDone) > s.opt.storeTimeout
}

// Match implements connector.Planner.
func (s *Planner) Match(r *connector.Request, computed int) (connector.Match, error) {
	if s.closed {
		return connector.Match{}, connector.ErrClosed
	}
	if err := s.checkRequest("Match", r); err != nil {
		return connector.Match{}, err
	}
	if computed < 0 || computed%s.bs != 0 {
		return connector.Match{}, fmt.Errorf("storeconn: Match(%q): computed = %d, want a multiple of the block size %d", r.ID, computed, s.bs)
	}
	if computed > r.Prompt {
		return connector.Match{}, fmt.Errorf("storeconn: Match(%q): computed = %d is more than the %d-token prompt", r.ID, computed, r.Prompt)
	}
	if n := r.Prompt / s.bs; len(r.Hashes) != n {
		return connector.Match{}, fmt.Errorf("storeconn: Match(%q): %d hashes for a %d-token prompt, want one per full block: %d", r.ID, len(r.Hashes), r.Prompt, n)
	}
	q := s.reqs[r.ID]
	if q == nil {
		// A request's first Match: its hashes are looked up from here on
		// (later calls answer from that lookup).
		for i, h := range r.Hashes[computed/s.bs:] {
			if h.IsZero() {
				return connector.Match{}, fmt.Errorf("storeconn: Match(%q): Request.Hashes[%d] is the zero BlockHash: hash every full block (hashing.Chain)", r.ID, computed/s.bs+i)
			}
		}
		q = s.newRequest(r.ID)
	} else if q.finished {
		return connector.Match{}, fmt.Errorf("storeconn: Match(%q): request finished and not yet released", r.ID)
	}
	from := computed / s.bs
	q.from, q.matchEnd = from, from
	for g := range q.saveNext {
		q.saveNext[g] = max(q.saveNext[g], from)
	}
	if !s.cfg.Role.CanLoad() {
		return connector.Match{}, nil
	}
	// Never the last prompt token: at most (Prompt-1)/B whole blocks.
	limit := 0
	if r.Prompt > 0 {
		limit = (r.Prompt - 1) / s.bs
	}
	limit = min(limit, len(r.Hashes))
	if from >= limit {
		return connector.Match{}, nil
	}
	// answered: the last lookup ended before this call, so an earlier
	// Match could answer from it. One that fails while this call collects
	// it is answered now, as a miss: retried at once, a lookup of a store
	// that is down would answer Pending for as long as it is down.
	answered := q.lk != nil && q.lk.done
	if q.lk != nil && !q.lk.done {
		s.collect()
	}
	if q.lk == nil || q.lk.gen != s.meta.Generation || q.lk.from > from ||
		(q.lk.done && (q.lk.err != nil && answered || (q.lk.all || !s.plain) && q.lk.from+len(q.lk.hashes) < len(r.Hashes))) {
		// A new lookup: none yet, an older generation, the engine lost
		// local blocks the last one assumed, the last one failed (and a
		// Match answered its miss), or the
		// prompt has grown since and later blocks may count: with one
		// full-attention group only if it found every block it probed;
		// with groups always, as a later point may be resumable although
		// an earlier block is absent.
		s.collect()
		lk := &lookup{
			req:  r.ID,
			gen:  s.meta.Generation,
			from: from,
			// Every full block, also the one the last-token rule
			// keeps out of the match: a block found present is
			// never saved again.
			hashes: append([]hashing.BlockHash(nil), r.Hashes[from:]...),
			ns:     s.ns,
			groups: len(s.groups),
		}
		s.stats.Lookups++
		s.stats.LookupKeys += int64(len(lk.hashes) * s.perBlock)
		if s.opt.syncLookup {
			s.probe([]*lookup{lk}, &s.syncScratch)
			lk.done = true
			s.stats.LookupNanos += lk.nanos
		} else {
			now := time.Now()
			if s.stuck(now) {
				// Every lookup would wait behind a hung call: a miss.
				s.stats.Lookups--
				s.stats.LookupKeys -= int64(len(lk.hashes) * s.perBlock)
				return connector.Match{}, nil
			}
			select {
			case s.jobs <- lk:
				if s.pending == 0 {
					s.lastDone = now
				}
				s.pending++
			default:
				// The queue is full: try again next step.
				s.stats.Lookups--
				s.stats.LookupKeys -= int64(len(lk.hashes) * s.perBlock)
				return s.waitLookup(), nil
			}
		}
		q.lk = lk
	}
	if !q.lk.done {
		// Past the store timeout since the pool took it up, or queued
		// behind a pool that is stuck: the store has not answered.
		now := time.Now()
		p := q.lk.picked.Load()
		if p != 0 && now.Sub(time.Unix(0, p)) > s.opt.storeTimeout || p == 0 && s.stuck(now) {
			// The store has not answered within its deadline: a miss.
			// The lookup is abandoned; if it ever ends it is ignored.
			s.h.record("exists", fmt.Errorf("lookup of %q: no answer in %v: %w", r.ID, s.opt.storeTimeout, context.DeadlineExceeded))
			q.lk = &lookup{req: r.ID, gen: s.meta.Generation, from: from, done: true, err: context.DeadlineExceeded}
			return connector.Match{}, nil
		}
		return s.waitLookup(), nil
	}
	if q.lk.err != nil {
		// A failed lookup is a miss, not an error: recompute is always safe.
		return connector.Match{}, nil
	}
	end := s.resumeEnd(q.lk, r.Hashes, from, limit, time.Time{})
	if len(s.failed.m) > 0 {
		if e := s.resumeEnd(q.lk, r.Hashes, from, end, time.Now()); e < end {
			s.stats.FailedSkipped += int64(end - e)
			end = e
		}
	}
	if end <= from {
		return connector.Match{}, nil
	}
	if e := s.fastEnd(q.lk, r.Hashes, from, end); e < end {
		s.stats.SlowSkipped += int64(end - e)
		if end = e; end <= from {
			return connector.Match{}, nil
		}
	}
	q.matchEnd = end
	return connector.Match{Tokens: (end - from) * s.bs}, nil
}

// newRequest starts tracking request id.
func (s *Planner) newRequest(id connector.RequestID) *request {
	q := &request{id: id, saveNext: make([]int, len(s.groups)), noSave: make([]int, len(s.groups)), deferNext: make([]int, len(s.groups)), loadFail: -1}
	if !s.plain {
		q.held = make([][]connector.BlockID, len(s.groups))
	}
	s.reqs[id] = q
	return q
}

// resumeEnd returns the largest block boundary p in [from, limit] that a
// request whose first from blocks are local can resume from with what lk
// found: every group has what it needs at p (see [resumable]). With now
// not zero, blocks whose loads failed lately count as absent.
func (s *Planner) resumeEnd(lk *lookup, hashes []hashing.BlockHash, from, limit int, now time.Time) int {
	limit = min(limit, lk.from+len(lk.hashes))
	if limit <= from {
		return from
	}
	// Full attention: the first absent block ends every candidate.
	end := limit
	for g, spec := range s.groups {
		if spec.Kind != hashing.FullAttention {
			continue
		}
		for i := from; i < end; i++ {
			if !s.present(lk, g, i, hashes, now) {
				end = i
				break
			}
		}
	}
	if s.plain {
		return end
	}
	for p := end; p > from; p-- {
		if s.resumable(lk, p, from, hashes, now, true) {
			return p
		}
	}
	return from
}

// present reports whether lk found block i of group g (i at or after
// lk.from), and, with now not zero, that its load has not failed lately.
func (s *Planner) present(lk *lookup, g, i int, hashes []hashing.BlockHash, now time.Time) bool {
	k := i - lk.from
	if k < 0 || k >= len(lk.hashes) || !lk.has[g][k] || s.gating && s.decided[lk.tierOf(g, k)] == tierHeld {
		return false
	}
	return now.IsZero() || !s.failed.has(groupHash{g, hashes[i]}, now)
}

// resumable reports whether a request whose first from blocks are local
// can resume at block boundary p > from with what lk found. Group by
// group, it needs: full attention, every block in [from, p) (skipped when
// fullChecked); a sliding window, the blocks in [from, p) that hold the
// tokens [p×B−W+1, p×B), the window before the token at p×B (which attends
// to itself and the W−1 before it); a state group, the state after block
// p−1.
func (s *Planner) resumable(lk *lookup, p, from int, hashes []hashing.BlockHash, now time.Time, fullChecked bool) bool {
	for g, spec := range s.groups {
		lo := from
		switch spec.Kind {
		case hashing.FullAttention:
			if fullChecked {
				continue
			}
		case hashing.SlidingWindow:
			lo = max(from, windowStart(p, s.bs, spec.Window))
		case hashing.RecurrentState:
			lo = p - 1
		}
		for i := lo; i < p; i++ {
			if !s.present(lk, g, i, hashes, now) {
				return false
			}
		}
	}
	return true
}

// windowStart returns the first block a sliding window of w tokens needs
// to resume at block boundary p (blocks of bs tokens): the block holding
// token p×bs−w+1, or 0.
func windowStart(p, bs, w int) int {
	first := p*bs - w + 1
	if first <= 0 {
		return 0
	}
	return first / bs
}

// checkRequest refuses a request the connector cannot track: an empty ID
// or an empty prompt.
func (s *Planner) checkRequest(op string, r *connector.Request) error {
	if r.ID == "" {
		return fmt.Errorf("storeconn: %s: Request.ID is empty", op)
	}
	if r.Prompt <= 0 {
		return fmt.Errorf("storeconn: %s(%q): Request.Prompt = %d, want > 0", op, r.ID, r.Prompt)
	}
	if r.Tokens != nil && len(r.Tokens) < len(r.Hashes)*s.bs {
		return fmt.Errorf("storeconn: %s(%q): Request.Tokens holds %d tokens, fewer than the %d of its %d full blocks (Hashes): give every token of them, or none", op, r.ID, len(r.Tokens), len(r.Hashes)*s.bs, len(r.Hashes))
	}
	return nil
}

// checkTable refuses, in group g's table, block ids outside the group's
// pool when it is known and negative ids other than connector.NoBlock (which a
// full-attention table may not hold at all), a comparison each; and among
// blocks[lo:hi], the blocks the call transfers, an id named twice and,
// unless skip says the call passes over them, NoBlock.
func (s *Planner) checkTable(op string, r *connector.Request, g int, blocks []connector.BlockID, lo, hi int, skip bool) error {
	name := func(i int) string {
		if len(s.groups) == 1 {
			return fmt.Sprintf("blocks[%d]", i)
		}
		return fmt.Sprintf("blocks[%d][%d] (group %d, %s)", g, i, g, s.groups[g].Kind)
	}
	noBlockOK := s.groups[g].Kind != hashing.FullAttention
	for i, b := range blocks {
		if b == connector.NoBlock && noBlockOK && (skip || i < lo || i >= hi) {
			continue
		}
		if pool := s.blocks[g]; b < 0 || pool > 0 && int(b) >= pool {
			switch {
			case b == connector.NoBlock && noBlockOK:
				return fmt.Errorf("%w: %s(%q): %s = NoBlock, but the call transfers it", connector.ErrInvalidBlock, op, r.ID, name(i))
			case pool > 0:
				return fmt.Errorf("%w: %s(%q): %s = %d, want [0, %d)", connector.ErrInvalidBlock, op, r.ID, name(i), b, pool)
			}
			return fmt.Errorf("%w: %s(%q): %s = %d, want >= 0", connector.ErrInvalidBlock, op, r.ID, name(i), b)
		}
	}
	if hi-lo < 2 {
		return nil
	}
	seen := s.seen[:0]
	for _, b := range blocks[lo:hi] {
		if b != connector.NoBlock {
			seen = append(seen, b)
		}
	}
	slices.Sort(seen)
	s.seen = seen
	for i := 1; i < len(seen); i++ {
		if seen[i] == seen[i-1] {
			if len(s.groups) == 1 {
				return fmt.Errorf("%w: %s(%q): block %d is named twice", connector.ErrInvalidBlock, op, r.ID, seen[i])
			}
			return fmt.Errorf("%w: %s(%q): block %d is named twice in the table of group %d", connector.ErrInvalidBlock, op, r.ID, seen[i], g)
		}
	}
	return nil
}

// loadRange returns the blocks [lo, p) of group g that a load resuming at
// block boundary p moves, for a request whose first from blocks are local.
func (s *Planner) loadRange(g, from, p int) (lo int) {
	switch spec := s.groups[g]; spec.Kind {
	case hashing.SlidingWindow:
		return max(from, windowStart(p, s.bs, spec.Window))
	case hashing.RecurrentState:
		return p - 1
	}
	return from
}

// Allocated implements connector.Planner. The load fills, in each
// group's table, the entries that resuming at the matched point needs
// beyond the local blocks: every block for full attention, the window
// before the point for a sliding window, the state at the point for a
// state group. Entries outside them are neither read nor written.
func (s *Planner) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
	if s.closed {
		return connector.ErrClosed
	}
	if err := s.checkRequest("Allocated", r); err != nil {
		return err
	}
	if err := driver.CheckTables("storeconn: Allocated", r.ID, tables, len(s.groups), false); err != nil {
		return err
	}
	for g, t := range tables {
		if err := s.checkTable("Allocated", r, g, t, 0, 0, false); err != nil {
			return err
		}
	}
	q := s.reqs[r.ID]
	if q == nil {
		return fmt.Errorf("%w: Allocated(%q) before Match", connector.ErrUnknownRequest, r.ID)
	}
	s.noteTables(q, tables)
	if external == 0 {
		return nil
	}
	if external < 0 || external%s.bs != 0 {
		return fmt.Errorf("storeconn: Allocated(%q): external = %d, want a multiple of the block size %d", r.ID, external, s.bs)
	}
	n := external / s.bs
	p := q.from + n
	if q.lk == nil || !q.lk.done || q.lk.err != nil || p > q.matchEnd || q.lk.gen != s.meta.Generation {
		return fmt.Errorf("storeconn: Allocated(%q): external = %d tokens exceeds the last match", r.ID, external)
	}
	var now time.Time
	if len(s.failed.m) > 0 {
		now = time.Now() // blocks whose loads failed lately do not count, as in Match
	}
	if !s.plain && !s.resumable(q.lk, p, q.from, r.Hashes, now, false) {
		return fmt.Errorf("storeconn: Allocated(%q): external = %d tokens ends at token %d, where the store cannot resume every KV cache group (the last match ended at token %d)", r.ID, external, p*s.bs, q.matchEnd*s.bs)
	}
	if p > len(r.Hashes) {
		return fmt.Errorf("%w: Allocated(%q): %d hashes do not cover %d tokens", connector.ErrInvalidBlock, r.ID, len(r.Hashes), p*s.bs)
	}
	for g, t := range tables {
		if p > len(t) {
			what := "blocks"
			if len(s.groups) > 1 {
				what = fmt.Sprintf("blocks in the table of group %d", g)
			}
			return fmt.Errorf("%w: Allocated(%q): %d %s do not cover %d tokens", connector.ErrInvalidBlock, r.ID, len(t), what, p*s.bs)
		}
	}
	if q.loads > 0 {
		return fmt.Errorf("storeconn: Allocated(%q): a load is already planned", r.ID)
	}
	for g, t := range tables {
		if err := s.checkTable("Allocated", r, g, t, s.loadRange(g, q.from, p), p, false); err != nil {
			return err
		}
	}
	for g, t := range tables {
		lo := s.loadRange(g, q.from, p)
		if lo >= p {
			continue
		}
		s.nextID++
		tr := connector.Transfer{
			ID:     s.nextID,
			Req:    r.ID,
			Group:  g,
			First:  lo,
			Blocks: append([]connector.BlockID(nil), t[lo:p]...),
			Hashes: append([]hashing.BlockHash(nil), r.Hashes[lo:p]...),
		}
		s.meta.Loads = append(s.meta.Loads, tr)
		x := s.track(q, &tr, true, 0)
		x.tier = q.lk.lowestTier(g, lo, p)
		q.loads++
	}
	q.loadFail, q.loadFrom = -1, q.from
	q.loadEnd = p
	// Loaded blocks are in the store, and the engine computes none of the
	// tokens before p: never save them again.
	for g := range q.saveNext {
		q.saveNext[g] = max(q.saveNext[g], p)
	}
	s.stats.HitBlocks += int64(n)
	s.stats.HitTokens += int64(external)
	return nil
}

// track records a planned transfer. The record shares the Transfer's
// blocks and hashes; Plan hands the engine copies (driver.PlanBuffer).
func (s *Planner) track(q *request, t *connector.Transfer, load bool, tries int) *transfer {
	x := &transfer{
		req:    q,
		load:   load,
		group:  t.Group,
		gen:    s.meta.Generation,
		first:  t.First,
		blocks: t.Blocks,
		hashes: t.Hashes,
		failAt: -1,
		tries:  tries,
	}
	if load && s.opt.prefillRate > 0 {
		x.planned = time.Now()
	}
	if !load {
		x.noSpace = make([]bool, len(t.Blocks))
		x.failed = make([]bool, len(t.Blocks))
		for _, h := range t.Hashes {
			s.saving[groupHash{t.Group, h}]++
			if s.w != nil {
				s.w.fly(groupHash{t.Group, h})
			}
		}
	}
	s.transfers.Add(t.ID, len(t.Blocks), x)
	q.inflight++
	return x
}

// trackSave records a save that Scheduled planned for r, with what its
// BlockStored events need: the parent hash and, if r has them, the
// blocks' tokens (copied: the engine's Request is not kept).
func (s *Planner) trackSave(q *request, r *connector.Request, t *connector.Transfer) {
	x := s.track(q, t, false, 0)
	if t.First > 0 {
		x.prev = r.Hashes[t.First-1]
	}
	if end := (t.First + len(t.Blocks)) * s.bs; len(r.Tokens) >= end {
		x.tokens = slices.Clone(r.Tokens[t.First*s.bs : end])
	}
}

// Scheduled implements connector.Planner. In every group, the full
// blocks computed so far that the store lacks are saved, except entries
// that are connector.NoBlock: sliding-window blocks the engine freed, and
// block boundaries whose state it did not keep.
func (s *Planner) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
	if s.closed {
		return connector.ErrClosed
	}
	if err := s.checkRequest("Scheduled", r); err != nil {
		return err
	}
	if computed < 0 {
		return fmt.Errorf("storeconn: Scheduled(%q): computed = %d, want >= 0", r.ID, computed)
	}
	if err := driver.CheckTables("storeconn: Scheduled", r.ID, tables, len(s.groups), false); err != nil {
		return err
	}
	for g, t := range tables {
		if err := s.checkTable("Scheduled", r, g, t, 0, 0, false); err != nil {
			return err
		}
		if spec := s.groups[g]; spec.Kind == hashing.SlidingWindow && computed > 0 {
			// The blocks of the window the next token attends to hold
			// computed KV: none of them may be missing.
			first := computed - spec.Window + 1
			for i := max(first, 0) / s.bs; i <= (computed-1)/s.bs && i < len(t); i++ {
				if t[i] == connector.NoBlock {
					return fmt.Errorf("%w: Scheduled(%q): blocks[%d][%d] = NoBlock, inside the %d-token sliding window of group %d before position %d (blocks %d to %d)",
						connector.ErrInvalidBlock, r.ID, g, i, spec.Window, g, computed, max(first, 0)/s.bs, (computed-1)/s.bs)
				}
			}
		}
	}
	if r.Tokens != nil && computed > len(r.Tokens) {
		return fmt.Errorf("storeconn: Scheduled(%q): computed = %d is more than the %d tokens of Request.Tokens", r.ID, computed, len(r.Tokens))
	}
	q := s.reqs[r.ID]
	if q == nil {
		q = s.newRequest(r.ID)
	}
	if q.finished {
		return fmt.Errorf("storeconn: Scheduled(%q): request finished", r.ID)
	}
	s.noteTables(q, tables)
	if !s.cfg.Role.CanSave() {
		return nil
	}
	// computed may pass Prompt (an engine that does not count its decodes
	// in Prompt) and blocks the Hashes do not cover yet (hashed after the
	// step): those are saved by a later Scheduled that has their hashes.
	full := min(computed/s.bs, len(r.Hashes))
	for g, t := range tables {
		if full > len(t) {
			if len(s.groups) == 1 {
				return fmt.Errorf("%w: Scheduled(%q): %d blocks do not hold %d computed tokens", connector.ErrInvalidBlock, r.ID, len(t), computed)
			}
			return fmt.Errorf("%w: Scheduled(%q): %d blocks in the table of group %d do not hold %d computed tokens", connector.ErrInvalidBlock, r.ID, len(t), g, computed)
		}
	}
	for g, t := range tables {
		if start := max(q.saveNext[g], q.noSave[g]); start < full {
			if err := s.checkTable("Scheduled", r, g, t, start, full, true); err != nil {
				return err
			}
			for i := start; i < full; i++ {
				if r.Hashes[i].IsZero() {
					// Saved under the zero hash, the block would answer
					// any request whose hash was never set.
					return fmt.Errorf("storeconn: Scheduled(%q): Request.Hashes[%d] is the zero BlockHash: hash every full block (hashing.Chain)", r.ID, i)
				}
			}
		}
	}
	if q.loads > 0 {
		// r computes in the step of its load (a connector.LayerWorker
		// engine): what it computes is valid only if every worker loads
		// its blocks. The saves wait for that (see confirmLoad).
		s.deferSaves(q, r, full, tables)
		return nil
	}
	for g, t := range tables {
		start := max(q.saveNext[g], q.noSave[g])
		var tr *connector.Transfer
		for i := start; i < full; i++ {
			h := r.Hashes[i]
			if t[i] == connector.NoBlock {
				continue
			}

			if s.knownPresent(q, g, i) || s.saving[groupHash{g, h}] > 0 {
				s.stats.SaveSkipped++
				continue
			}
			if tr != nil && tr.First+len(tr.Blocks) != i {
				// A gap (a skipped block): start another transfer so
				// that First still locates every block.
				s.trackSave(q, r, tr)
				tr = nil
			}
			if tr == nil {
				s.nextID++
				s.meta.Saves = append(s.meta.Saves, connector.Transfer{ID: s.nextID, Req: r.ID, Group: g, First: i})
				tr = &s.meta.Saves[len(s.meta.Saves)-1]
			}
			tr.Blocks = append(tr.Blocks, t[i])
			tr.Hashes = append(tr.Hashes, h)
		}
		if tr != nil {
			s.trackSave(q, r, tr)
		}
		q.saveNext[g] = max(q.saveNext[g], full)
	}
	return nil
}

// deferSaves records the saves that Scheduled would plan for r while its
// load runs, as runs of blocks with copies of what they need, replacing
// those of an earlier call: confirmLoad plans them once every worker
// reported the load, a failed load drops them. Until then saveNext stays,
// so a later call records them again.
func (s *Planner) deferSaves(q *request, r *connector.Request, full int, tables [][]connector.BlockID) {
	q.deferred = q.deferred[:0]
	q.deferStep = s.meta.Step + 1 // the next Plan's
	for g, t := range tables {
		start := max(q.saveNext[g], q.noSave[g])
		var rt *retry
		for i := start; i < full; i++ {
			if t[i] == connector.NoBlock || s.knownPresent(q, g, i) || s.saving[groupHash{g, r.Hashes[i]}] > 0 {
				rt = nil
				continue
			}
			if rt == nil {
				q.deferred = append(q.deferred, retry{req: q, group: g, first: i, deferred: true})
				rt = &q.deferred[len(q.deferred)-1]
				if i > 0 {
					rt.prev = r.Hashes[i-1]
				}
			}
			rt.blocks = append(rt.blocks, t[i])
			rt.hashes = append(rt.hashes, r.Hashes[i])
			if len(r.Tokens) >= full*s.bs {
				rt.tokens = append(rt.tokens, r.Tokens[i*s.bs:(i+1)*s.bs]...)
			}
		}
		q.deferNext[g] = max(q.saveNext[g], full)
	}
}

// confirmLoad acts on a load of q that every worker reported with no
// failure: the saves deferred while it ran are planned in the next Plan,
// for the blocks the request's tables then still hold. Only the Update
// of the step that carried the load confirms them: a load reported later
// ended after the step's compute had read its blocks, so what the step
// computed is void (the engine discards it and recomputes), and so are
// the saves.
func (s *Planner) confirmLoad(q *request) {
	if len(q.deferred) == 0 {
		return
	}
	if s.meta.Step != q.deferStep {
		q.deferred = nil
		return
	}
	for _, rt := range q.deferred {
		rt.after = s.meta.Step
		q.retries++
		s.retries = append(s.retries, rt)
	}
	q.deferred = nil
	for g := range q.saveNext {
		q.saveNext[g] = max(q.saveNext[g], q.deferNext[g])
	}
}

// knownPresent reports whether the request's last lookup found block i of
// group g.
func (s *Planner) knownPresent(q *request, g, i int) bool {
	lk := q.lk
	return lk != nil && lk.done && lk.err == nil && lk.gen == s.meta.Generation && s.present(lk, g, i, nil, time.Time{})
}

// Plan implements connector.Planner.
func (s *Planner) Plan() *connector.Metadata {
	s.meta.Step++
	// Out-of-space saves whose wait is over go out again.
	kept := s.retries[:0]
	for _, rt := range s.retries {
		if rt.after > s.meta.Step {
			kept = append(kept, rt)
			continue
		}
		rt.req.retries--
		s.heldRuns(rt, func(first int, blocks []connector.BlockID, hashes []hashing.BlockHash, prev hashing.BlockHash, tokens []hashing.Token) {
			s.nextID++
			t := connector.Transfer{ID: s.nextID, Req: rt.req.id, Group: rt.group, First: first, Blocks: blocks, Hashes: hashes}
			s.meta.Saves = append(s.meta.Saves, t)
			x := s.track(rt.req, &s.meta.Saves[len(s.meta.Saves)-1], false, rt.tries)
			x.prev, x.tokens = prev, tokens
			if !rt.deferred {
				s.stats.SaveRetries += int64(len(blocks))
			}
		})
		s.maybeRelease(rt.req)
	}
	s.retries = kept
	m := s.plans.HandOut()
	s.meta = s.plans.Filling()
	return m
}

// heldRuns calls plan for each run of rt's blocks that the request's
// table of rt's group still holds in their entries, as the engine last
// passed it; the others count as failed saves: a block the engine freed
// (NoBlock) may hold another request's KV by now.
func (s *Planner) heldRuns(rt retry, plan func(first int, blocks []connector.BlockID, hashes []hashing.BlockHash, prev hashing.BlockHash, tokens []hashing.Token)) {
	var t []connector.BlockID
	if rt.req.held != nil {
		t = rt.req.held[rt.group]
	}
	if t == nil {
		plan(rt.first, rt.blocks, rt.hashes, rt.prev, rt.tokens)
		return
	}
	start := 0 // the first block of the current run
	for k := 0; k <= len(rt.blocks); k++ {
		if k < len(rt.blocks) {
			if i := rt.first + k; i < len(t) && t[i] == rt.blocks[k] {
				continue
			}
			s.stats.SaveFailures++
		}
		if k > start {
			prev := parentAt(rt.prev, rt.hashes, start)
			var tokens []hashing.Token
			if rt.tokens != nil {
				tokens = rt.tokens[start*s.bs : k*s.bs : k*s.bs]
			}
			plan(rt.first+start, rt.blocks[start:k:k], rt.hashes[start:k:k], prev, tokens)
		}
		start = k + 1
	}
}

// noteTables records, for q, the tables of its groups other than full
// attention (see request.held).
func (s *Planner) noteTables(q *request, tables [][]connector.BlockID) {
	if q.held == nil || len(tables) == 0 {
		return
	}
	for g, spec := range s.groups {
		if spec.Kind != hashing.FullAttention {
			q.held[g] = append(q.held[g][:0], tables[g]...)
		}
	}
}

// Update implements connector.Planner.
func (s *Planner) Update(outs []*connector.Output) (*connector.Progress, error) {
	if s.closed {
		return nil, connector.ErrClosed
	}
	s.progress.Loaded = s.progress.Loaded[:0]
	s.progress.Failed = s.progress.Failed[:0]
	s.progress.Released = s.progress.Released[:0]
	// The store's key events up to now come before the saves that
	// Outputs report: a key taken away after a save's put and before
	// its Output is seen while the save is in flight.
	s.drainWatch()
	// A bad Output is an error that changes nothing.
	if err := s.transfers.Apply("storeconn: Update", outs, s.failBlock, func(_ uint64, x *transfer) { s.finishTransfer(x) }); err != nil {
		return nil, err
	}
	s.progress.Released = append(s.progress.Released, s.released...)
	s.released = s.released[:0]
	if len(s.retries) > 0 {
		// Only steps bring a retry's turn: no reason to wait.
		s.signal()
	}
	s.boundEvents()
	return &s.progress, nil
}

// boundEvents keeps the KV events held for TakeEvents within event_buffer:
// an engine that never takes them (it publishes none) must not hold them
// all. Past the bound the events held are dropped and replaced by one
// AllCleared, counted in Stats.Resyncs, so that a reader who takes them
// late starts again from nothing rather than from a picture with holes.
func (s *Planner) boundEvents() {
	if len(s.events) <= s.opt.eventBuffer {
		return
	}
	clear(s.events)
	s.events = s.events[:0]
	if s.w != nil {
		s.resync(false)
		return
	}
	s.stats.Resyncs++
	s.events = append(s.events, connector.KVEvent{Kind: connector.AllCleared, Generation: s.meta.Generation})
}

// failBlock records a block of x that a worker reported failed.
func (s *Planner) failBlock(x *transfer, f connector.Failure) {
	switch {
	case x.load:
		if x.failAt < 0 || f.Index < x.failAt {
			x.failAt = f.Index
		}
		switch f.Reason {
		case connector.ReasonIO, connector.ReasonNotFound, connector.ReasonCorrupt:
			// The store said it holds the block, then failed to deliver
			// it: a dead client's segment, say. Its lookups would keep
			// planning loads that fail until the store forgets it.
			s.failed.add(groupHash{x.group, x.hashes[f.Index]}, time.Now().Add(s.opt.failedTTL))
		}
	case f.Reason == connector.ReasonNoSpace:
		x.noSpace[f.Index] = true
	default:
		x.failed[f.Index] = true
	}
}

// finishTransfer acts on a transfer that every worker reported.
func (s *Planner) finishTransfer(x *transfer) {
	q := x.req
	if x.load {
		q.loads--
		if x.failAt < 0 && !x.planned.IsZero() {
			s.measureLoad(x)
		}
		if x.gen != s.meta.Generation {
			// Loaded under weights that have since been rotated out: none
			// of it may be used, whatever the workers read.
			x.failAt = 0
		}
		if x.failAt >= 0 {
			// What survives: with full attention only, every block before
			// the first that failed; otherwise only the local blocks, as a
			// window or a state is of no use without the rest.
			valid := q.loadFrom
			if s.allFull() {
				valid = x.first + x.failAt
			}
			if q.loadFail < 0 || valid < q.loadFail {
				q.loadFail = valid
			}
		}
		if q.loads == 0 {
			if q.loadFail >= 0 {
				// Every matched block from the valid point on is
				// discarded, in whichever group the failure was.
				s.stats.LoadFailures += int64(q.loadEnd - q.loadFail)
				s.progress.Failed = append(s.progress.Failed, connector.LoadFailure{
					Req:   q.id,
					Valid: q.loadFail * s.bs,
					Fail:  s.cfg.LoadFailurePolicy == connector.PolicyFail,
				})
				// The lookup promised blocks the store no longer has:
				// look again next time, and save the blocks the engine
				// recomputes.
				q.lk = nil
				for g := range q.saveNext {
					q.saveNext[g] = min(q.saveNext[g], q.loadFail)
				}
				q.loadFail = -1
				q.deferred = nil // computed over KV that did not load
			} else {
				s.progress.Loaded = append(s.progress.Loaded, q.id)
				s.confirmLoad(q)
			}
		}
	} else {
		var rt *retry
		run := -1 // the first block of the current run of stored blocks
		for i, h := range x.hashes {
			if x.gen == s.meta.Generation {
				k := groupHash{x.group, h}
				if s.saving[k]--; s.saving[k] <= 0 {
					delete(s.saving, k)
				}
			}
			switch {
			case x.noSpace[i] && x.tries < s.opt.saveRetries && x.gen == s.meta.Generation:
				if rt == nil || rt.first+len(rt.blocks) != x.first+i {
					if rt != nil {
						s.retries = append(s.retries, *rt)
					}
					q.retries++
					rt = &retry{req: q, group: x.group, first: x.first + i, tries: x.tries + 1, after: s.meta.Step + uint64(s.opt.retryDelay), prev: x.parent(i)}
				}
				rt.blocks = append(rt.blocks, x.blocks[i])
				rt.hashes = append(rt.hashes, h)
				if x.tokens != nil {
					rt.tokens = append(rt.tokens, x.tokens[i*s.bs:(i+1)*s.bs]...)
				}
			case x.noSpace[i] || x.failed[i]:
				s.stats.SaveFailures++
			default:
				if run < 0 {
					run = i
				}
				continue
			}
			if s.w != nil && x.gen == s.meta.Generation {
				s.w.land(groupHash{x.group, h})
			}
			if run >= 0 {
				s.stored(x, run, i)
				run = -1
			}
		}
		if run >= 0 {
			s.stored(x, run, len(x.hashes))
		}
		if rt != nil {
			s.retries = append(s.retries, *rt)
		}
		if len(s.held) > 0 && x.gen == s.meta.Generation {
			for _, h := range x.hashes {
				s.release(groupHash{x.group, h})
			}
		}
	}
	q.inflight--
	s.maybeRelease(q)
}

// parent returns the hash of the block before block i of save x.
func (x *transfer) parent(i int) hashing.BlockHash { return parentAt(x.prev, x.hashes, i) }

// parentAt returns the hash of the block before block i of a run of
// consecutive blocks whose hashes are hashes, after the block of prev.
func parentAt(prev hashing.BlockHash, hashes []hashing.BlockHash, i int) hashing.BlockHash {
	if i == 0 {
		return prev
	}
	return hashes[i-1]
}

// stored announces blocks [i, j) of save x, which every worker stored, in
// a BlockStored event, unless x's generation was rotated out. While a
// save of the parent block is in flight the event waits for it (see
// release), so that routers, which index a block under its parent, see
// the parent first.
func (s *Planner) stored(x *transfer, i, j int) {
	if x.gen != s.meta.Generation {
		return
	}
	ev := connector.KVEvent{Kind: connector.BlockStored, Generation: x.gen, Group: x.group, Hashes: slices.Clone(x.hashes[i:j]), Parent: x.parent(i), BlockSize: s.bs}
	if x.tokens != nil {
		// x's own copy, which nothing else reads or writes.
		ev.Tokens = x.tokens[i*s.bs : j*s.bs : j*s.bs]
	}
	if p := (groupHash{x.group, ev.Parent}); !ev.Parent.IsZero() && s.saving[p] > 0 {
		if s.held == nil {
			s.held = make(map[groupHash][]connector.KVEvent)
		}
		s.held[p] = append(s.held[p], ev)
		return
	}
	s.announce(ev)
}

// release announces the events held for the save of block b once no save
// of b is in flight (it landed, stored or failed: a child whose parent
// failed is announced all the same, after it), and in turn those held for
// their blocks.
func (s *Planner) release(b groupHash) {
	evs, ok := s.held[b]
	if !ok || s.saving[b] > 0 {
		return
	}
	delete(s.held, b)
	for _, ev := range evs {
		s.announce(ev)
		for _, h := range ev.Hashes {
			s.release(groupHash{ev.Group, h})
		}
	}
}

// maybeRelease forgets a finished request once nothing touches its blocks.
func (s *Planner) maybeRelease(q *request) {
	if q.finished && q.inflight == 0 && q.retries == 0 {
		delete(s.reqs, q.id)
		s.released = append(s.released, q.id)
	}
}

// Finish implements connector.Planner.
func (s *Planner) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	if err := driver.CheckTables("storeconn: Finish", r.ID, tables, len(s.groups), true); err != nil {
		return false, err
	}
	if s.closed {
		return false, connector.ErrClosed
	}
	q := s.reqs[r.ID]
	if q == nil {
		return false, nil
	}
	if q.finished {
		return false, fmt.Errorf("storeconn: Finish(%q) called twice", r.ID)
	}
	s.noteTables(q, tables)
	if q.inflight == 0 && q.retries == 0 {
		delete(s.reqs, r.ID)
		return false, nil
	}
	q.finished = true
	return true, nil
}

// Rotate implements connector.Rotator: from the next Plan on, every key is
// bound to generation gen. Lookups of older generations are forgotten, out
// of space retries of older generations dropped, and no block that any
// request computed before the rotation is saved. Generations only move
// forward: gen must be greater than the current one, or Rotate returns an
// error wrapping [connector.ErrGeneration] and changes nothing.
func (s *Planner) Rotate(gen uint64) error {
	if s.closed {
		return connector.ErrClosed
	}
	if gen <= s.meta.Generation {
		return fmt.Errorf("storeconn: rotate to generation %d: %w than the current generation %d", gen, connector.ErrGeneration, s.meta.Generation)
	}
	id := s.id
	id.Generation = gen
	ns, err := id.Namespace()
	if err != nil {
		return fmt.Errorf("storeconn: rotate to generation %d: %w", gen, err)
	}
	old := s.meta.Generation
	s.id, s.ns = id, ns
	s.meta.Generation = gen
	clear(s.saving)
	clear(s.held) // the old generation's blocks: the AllCleared below covers them
	if s.w != nil {
		// The feed's events so far name keys of the old generation: taken
		// and dropped (the AllCleared below covers their blocks).
		s.drainWatch()
		clear(s.w.stored)
		clear(s.w.flight)
	}
	for _, rt := range s.retries {
		rt.req.retries--
		s.stats.StaleDiscarded += int64(len(rt.blocks))
		s.maybeRelease(rt.req)
	}
	s.retries = s.retries[:0]
	// Saves planned this step but not yet shipped belong to the old
	// weights: drop them.
	for _, t := range s.meta.Saves {
		if x, ok := s.transfers.Get(t.ID); ok {
			s.transfers.Drop(t.ID)
			x.req.inflight--
			s.stats.StaleDiscarded += int64(len(t.Blocks))
			s.maybeRelease(x.req)
		}
	}
	s.meta.Saves = s.meta.Saves[:0]
	for _, q := range s.reqs {
		q.lk = nil
		for g := range q.noSave {
			q.noSave[g] = max(q.noSave[g], q.saveNext[g])
		}
	}
	s.events = append(s.events, connector.KVEvent{Kind: connector.AllCleared, Generation: old})
	return nil
}

// TakeEvents implements connector.EventSource.
func (s *Planner) TakeEvents(dst []connector.KVEvent) []connector.KVEvent {
	if !s.closed {
		s.drainWatch()
	}
	dst = append(dst, s.events...)
	clear(s.events)
	s.events = s.events[:0]
	return dst
}

// Stats implements connector.StatsReporter.
func (s *Planner) Stats() connector.Stats {
	s.collect()
	st := s.stats
	st.StoreErrors, st.StoreTimeouts = s.h.counts()
	return st
}

// Health implements connector.HealthReporter: the store's answers to the
// half's lookups.
func (s *Planner) Health() connector.Health { return s.h.get() }

// Close implements connector.Planner. It does not close the store.
func (s *Planner) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	s.wakeMu.Lock()
	s.wakeMu.closed = true
	close(s.wake) // an engine waiting on it returns
	s.wakeMu.Unlock()
	s.cancel()
	if s.w != nil {
		s.w.feed.Close()
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	if !waitGroup(&s.wg, s.opt.storeTimeout) {
		// Lookups hold only their own keys: nothing of the engine's.
		return fmt.Errorf("storeconn: Close: lookups still inside store calls %v after cancellation: the store ignores its deadlines; they end when it answers", s.opt.storeTimeout)
	}
	return nil
}

// Namespace implements connector.Namespacer: the namespace of Env.Identity
// at the current generation.
func (s *Planner) Namespace() hashing.Namespace { return s.ns }

// Unsaved implements connector.UnsavedReporter: the saves planned and not
// reported by every worker, the out-of-space retries waiting for their
// step, and the saves held back while their request's load runs.
func (s *Planner) Unsaved(dst []connector.Unsaved) []connector.Unsaved {
	n := len(dst)
	for _, x := range s.transfers.All() {
		if !x.load {
			dst = append(dst, connector.Unsaved{Req: x.req.id, Group: x.group, First: x.first, Hashes: slices.Clone(x.hashes)})
		}
	}
	for _, rt := range s.retries {
		dst = append(dst, connector.Unsaved{Req: rt.req.id, Group: rt.group, First: rt.first, Hashes: slices.Clone(rt.hashes)})
	}
	for _, q := range s.reqs {
		for _, rt := range q.deferred {
			dst = append(dst, connector.Unsaved{Req: q.id, Group: rt.group, First: rt.first, Hashes: slices.Clone(rt.hashes)})
		}
	}
	slices.SortFunc(dst[n:], func(a, b connector.Unsaved) int {
		return cmp.Or(strings.Compare(string(a.Req), string(b.Req)), cmp.Compare(a.Group, b.Group), cmp.Compare(a.First, b.First))
	})
	return dst
}

// allFull reports whether every group is full attention.
func (s *Planner) allFull() bool {
	for _, g := range s.groups {
		if g.Kind != hashing.FullAttention {
			return false
		}
	}
	return true
}

// failedKeys remembers blocks whose loads failed, until a deadline each.
type failedKeys struct {
	m map[groupHash]time.Time
}

// maxFailedKeys bounds the memory of failed blocks; past it, expired
// entries are dropped, then the oldest half.
const maxFailedKeys = 1 << 16

func (f *failedKeys) add(h groupHash, until time.Time) {
	if len(f.m) >= maxFailedKeys {
		now := time.Now()
		for k, t := range f.m {
			if !now.Before(t) {
				delete(f.m, k)
			}
		}
		if len(f.m) >= maxFailedKeys {
			n := 0
			for k := range f.m {
				delete(f.m, k)
				if n++; n >= maxFailedKeys/2 {
					break
				}
			}
		}
	}
	f.m[h] = until
}

func (f *failedKeys) has(h groupHash, now time.Time) bool {
	t, ok := f.m[h]
	if ok && !now.Before(t) {
		delete(f.m, h)
		return false
	}
	return ok
}
