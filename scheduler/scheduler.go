package scheduler

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// Scheduler is the engine side of the connector contract: a block pool
// with a local prefix cache, the lifecycle of every request, and a
// reference step planner, driving a [connector.Planner] (or none) in the
// order the contract asks.
//
// It is deterministic: the same calls, with the same connector answers,
// give the same plans. It does no I/O and starts no goroutine. It is not
// safe for concurrent use: the engine calls it from its scheduling loop.
type Scheduler struct {
	cfg      Config
	id       hashing.Identity
	ns       hashing.Namespace
	bs       int // tokens per block
	groups   []group
	pools    []*Pool           // pools[g] is group g's
	plain    bool              // one full-attention group: the layout without groups
	align    bool              // a state group: prefill chunks end at block boundaries
	conn     connector.Planner // nil: local prefix cache only
	detached bool              // Invalidate found no Rotator: no more lookups or saves
	busy     *busy             // the sliding-window blocks unfinished transfers name; nil without such groups or a connector
	ranks    *ranks            // what each worker rank owes, and its last Output; nil without a connector

	reqs    map[connector.RequestID]*request
	waiting queue // Waiting and LookupPending, in arrival order
	running queue // Running, in arrival order
	loading queue // Loading, in arrival order
	held    int   // requests whose blocks the connector keeps
	spare   []*request

	step        uint64
	inFlight    bool
	news        bool // since the last step, something may have made a request runnable (see Idle)
	epoch       uint64
	nextSeq     uint64
	pendingFree []int // per group: blocks that held requests alone hold, free once released

	plan      Plan
	items     []*request // items[i] is the request of plan.Items[i]
	results   []*request // results[i] is the request of Done's results[i]
	ended     []Ended
	discarded []connector.RequestID // the last Done's requests whose work of the step was void
	hits      []BlockID
	hitTabs   [][]BlockID // per group: the blocks of a local hit (see localHit)
	need      []int       // per group: blocks a growth needs
	avail     []int       // per group: blocks an admission may take
	scratch   []hashing.BlockHash
	stats     Stats
	mut       mutation // a deliberate bug, in the package's tests only
}

// Plan is one step's work: what each request computes, and the connector's
// Metadata for the workers. It is owned by the Scheduler and valid until
// the next Done: its slices alias the scheduler's tables.
type Plan struct {
	Step uint64 // the step's index, from 1
	// Items are the requests to compute, decodes first, each in arrival
	// order.
	Items []Item
	// Metadata is the connector's plan for the step (loads and saves), to
	// ship to every worker before the step runs; nil without a connector.
	Metadata *connector.Metadata
	// Preempted lists the requests preempted while planning the step.
	Preempted []connector.RequestID
}

// Item is one request's share of a step.
type Item struct {
	ID connector.RequestID
	// Start and End bound the positions to compute: [Start, End).
	Start, End int
	// Tokens are the request's tokens up to End; the step computes
	// Tokens[Start:End], attending to the KV of positions before Start.
	Tokens []hashing.Token
	// Blocks is the request's block table: Blocks[i] holds the KV of
	// positions [i*B, (i+1)*B) for block size B. It covers End positions.
	// With KV cache groups it is Tables[0].
	Blocks []BlockID
	// Tables are the request's block tables, one per KV cache group of
	// the layout, in its order (one, Blocks, without groups). Each covers
	// End positions; entry i of group g is block i of g's memory, or
	// connector.NoBlock: in a sliding-window group, a block out of the
	// window of every position the step computes; in a state group, a
	// block boundary whose state is not kept. See "KV cache groups" in the
	// package doc.
	Tables [][]BlockID
	// State names the entries of every state group's table that the step
	// reads and writes; all -1 for a layout without a state group.
	State StateEntries
	// Sample is true when End reaches the request's last known token: the
	// engine samples the next token and reports it in Done.
	Sample bool
}

// StateEntries are the entries of a state group's block table that one
// step of one request uses (the same for every state group). The engine
// reads the state at In, runs the item's positions through its recurrent
// layers, and writes the state after blocks 0..Snapshot to Snapshot
// (unless it is -1) and the state after End to Out.
type StateEntries struct {
	// In is the entry that holds the state after the first Start tokens,
	// (Start-1)/B; -1 when Start is 0 (the initial state).
	In int
	// Snapshot, unless -1, is an entry that receives the state after the
	// tokens of blocks 0..Snapshot, a block boundary inside (Start, End):
	// for an item that reaches the request's last token, the last
	// boundary before it, where a prefix cache may resume the same prompt.
	Snapshot int
	// Out is the entry that receives the state after End tokens,
	// (End-1)/B. It is In when the step stays inside one block (a decode):
	// the engine updates that state in place.
	Out int
}

// noState is the StateEntries of a layout without a state group.
var noState = StateEntries{In: -1, Snapshot: -1, Out: -1}

// Result is the engine's report of one sampled token.
type Result struct {
	ID       connector.RequestID
	Token    hashing.Token // the sampled token
	Finished bool          // the request ends with this token (EOS, max tokens)
}

// Stats are the scheduler's occupancy and counters.
type Stats struct {
	Step          uint64 // steps planned
	Waiting       int    // requests waiting, lookup-pending ones included
	LookupPending int    // of which the connector's lookup runs
	Loading       int    // requests loading external KV
	Running       int    // requests running
	Held          int    // requests (ended or preempted) whose blocks the connector keeps

	Admitted       int64 // admissions (a preempted request counts again)
	Preemptions    int64
	Finished       int64
	Failed         int64
	Aborted        int64
	LocalTokens    int64 // tokens served from the local prefix cache
	ExternalTokens int64 // tokens loaded through the connector
	ComputedTokens int64 // tokens computed
	LoadFailures   int64 // failed loads
	InlineLoads    int64 // loads run in the step that computed their request (Config.LayerwiseLoads)
	DiscardedSteps int64 // of which the step's work was discarded: the load failed or went unreported
	// Pool is the block pool's: with KV cache groups, the sum of every
	// group's pool (see [Scheduler.PoolStats]).
	Pool PoolStats
}

// group is what the scheduler needs of one KV cache group.
type group struct {
	kind   hashing.GroupKind
	window int // tokens, for a sliding-window group
}

// New returns a scheduler for cfg driving conn, which may be nil: then the
// scheduler works with its local prefix cache only. The scheduler does not
// close conn. A conn that is a [connector.Namespacer] must have been
// opened with cfg.Identity: another namespace is an error naming both.
func New(cfg Config, conn connector.Planner) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ns, err := cfg.Identity.Namespace()
	if err != nil {
		return nil, fmt.Errorf("%w: Identity: %w", ErrConfig, err)
	}
	if n, ok := conn.(connector.Namespacer); ok {
		if cn := n.Namespace(); cn.String() != ns.String() {
			return nil, fmt.Errorf("%w: the connector was opened for namespace %s, Config.Identity is namespace %s: open it with the same Identity (Env.Identity)", ErrConfig, cn, ns)
		}
	}
	s := &Scheduler{
		cfg:  cfg,
		id:   cfg.Identity,
		ns:   ns,
		bs:   cfg.Identity.Layout.BlockSize,
		conn: conn,
		reqs: make(map[connector.RequestID]*request),
	}
	for g, spec := range cfg.Identity.Layout.EffectiveGroups() {
		pool, err := NewPool(cfg.poolSize(g))
		if err != nil {
			return nil, fmt.Errorf("%w: group %d: %w", ErrConfig, g, err)
		}
		s.groups = append(s.groups, group{kind: spec.Kind, window: spec.Window})
		s.pools = append(s.pools, pool)
		s.align = s.align || spec.Kind == hashing.RecurrentState
	}
	s.plain = len(s.groups) == 1 && s.groups[0].kind == hashing.FullAttention
	n := len(s.groups)
	if conn != nil {
		sizes := make([]int, n)
		for g := range sizes {
			sizes[g] = cfg.poolSize(g)
		}
		s.busy = newBusy(s.groups, sizes, cfg.Identity.Layout.TPSize)
		bound := cfg.RankSteps
		if bound == 0 {
			bound = DefaultRankSteps
		}
		s.ranks = newRanks(cfg.Identity.Layout.TPSize, bound)
	}
	s.pendingFree = make([]int, n)
	s.hitTabs = make([][]BlockID, n)
	s.need = make([]int, n)
	s.avail = make([]int, n)
	return s, nil
}

// PoolStats returns the occupancy and counters of group g's block pool
// (group 0 without groups). It panics if g is not a group of the layout.
func (s *Scheduler) PoolStats(g int) PoolStats { return s.pools[g].Stats() }

// BlockSize returns the block size in tokens.
func (s *Scheduler) BlockSize() int { return s.bs }

// Generation returns the current weights generation.
func (s *Scheduler) Generation() uint64 { return s.id.Generation }

// Namespace returns the namespace of the local prefix cache.
func (s *Scheduler) Namespace() hashing.Namespace { return s.ns }

func (s *Scheduler) blocksFor(tokens int) int { return (tokens + s.bs - 1) / s.bs }

// lookups reports whether Match is called for waiting requests.
func (s *Scheduler) lookups() bool {
	if s.conn == nil || s.detached {
		return false
	}
	switch s.cfg.ExternalLookup {
	case LookupAlways:
		return true
	case LookupAuto:
		return s.cfg.PrefixCaching || s.mut == mutLookupAlways
	}
	return false
}

// Add queues a request. Its blocks are hashed now (full blocks only), and
// again incrementally as tokens are generated. Add may be called at any
// time, also between Step and Done; the request is planned from the next
// Step on.
func (s *Scheduler) Add(req Request) error {
	switch {
	case req.ID == "":
		return fmt.Errorf("scheduler: Add: Request.ID is empty")
	case s.reqs[req.ID] != nil:
		return fmt.Errorf("%w: Add(%q): the ID is in use (%v)", ErrDuplicateRequest, req.ID, s.reqs[req.ID].state)
	case len(req.Prompt) == 0:
		return fmt.Errorf("scheduler: Add(%q): Request.Prompt is empty", req.ID)
	case req.MaxTokens < 0:
		return fmt.Errorf("scheduler: Add(%q): Request.MaxTokens = %d, want >= 0", req.ID, req.MaxTokens)
	}
	if err := s.fitsPools(len(req.Prompt)); err != nil {
		return fmt.Errorf("%w: Add(%q): %w", ErrTooLarge, req.ID, err)
	}
	var chain *hashing.Chain
	if len(req.Extras) > 0 {
		var err error
		if chain, err = hashing.NewChain(s.bs, req.Extras...); err != nil {
			return fmt.Errorf("scheduler: Add(%q): %w", req.ID, err)
		}
	}
	r := s.newRequest()
	if chain == nil {
		// A request without extras reuses the chain of one that ended.
		if r.chain != nil && r.plain {
			chain = r.chain
			chain.Reset()
		} else {
			var err error
			if chain, err = hashing.NewChain(s.bs); err != nil {
				s.spare = append(s.spare, r)
				return fmt.Errorf("scheduler: Add(%q): %w", req.ID, err)
			}
		}
	}
	r.plain = len(req.Extras) == 0
	r.id = req.ID
	r.seq = s.nextSeq
	s.nextSeq++
	r.state = Waiting
	// Room for the tokens it may generate, but never more than the pool
	// holds: a request cannot grow past that (it fails when it outgrows
	// the pool), so a huge MaxTokens reserves no more.
	size := len(req.Prompt) + min(req.MaxTokens, s.pools[0].Len()*s.bs)
	r.tokens = append(growCap(r.tokens[:0], size), req.Prompt...)
	if req.MaxTokens > 0 {
		for g := range r.tabs {
			r.tabs[g] = growCap(r.tabs[g][:0], s.blocksFor(size))
			if r.gs[g].shown != nil {
				r.gs[g].shown = growCap(r.gs[g].shown[:0], s.blocksFor(size))
			}
		}
	}
	r.chain = chain
	s.scratch = chain.Append(s.scratch[:0], req.Prompt...)
	r.creq = connector.Request{ID: req.ID, Prompt: len(r.tokens), Hashes: chain.Hashes(), Tokens: r.tokens, TransferParams: slices.Clone(req.TransferParams)}
	r.m = Metrics{Added: s.step}
	s.reqs[req.ID] = r
	s.waiting = append(s.waiting, r) // the newest: last in arrival order
	s.news = true
	return nil
}

// fitsPools reports, as an error naming the group, when a prompt of
// tokens tokens needs more blocks than a full-attention group's pool holds.
func (s *Scheduler) fitsPools(tokens int) error {
	for g, gr := range s.groups {
		if gr.kind == hashing.FullAttention && s.blocksFor(tokens) > s.pools[g].Len() {
			return fmt.Errorf("a %d-token prompt needs %d blocks, the pool%s has %d", tokens, s.blocksFor(tokens), s.groupName(g), s.pools[g].Len())
		}
	}
	return nil
}

// groupName names group g in errors: "" without groups.
func (s *Scheduler) groupName(g int) string {
	if len(s.groups) == 1 {
		return ""
	}
	return fmt.Sprintf(" of group %d (%s)", g, s.groups[g].kind)
}

func growCap[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s
}

// maxSpare bounds the records of ended requests kept for reuse.
const maxSpare = 256

func (s *Scheduler) newRequest() *request {
	if k := len(s.spare); k > 0 {
		r := s.spare[k-1]
		s.spare[k-1] = nil
		s.spare = s.spare[:k-1]
		return r
	}
	n := len(s.groups)
	r := &request{tabs: make([][]BlockID, n), gs: make([]reqGroup, n), view: make([][]BlockID, n)}
	for g, gr := range s.groups {
		if gr.kind == hashing.SlidingWindow {
			r.gs[g].shown = []BlockID{}
		}
	}
	return r
}

// forget drops a request whose blocks are back in the pool.
func (s *Scheduler) forget(r *request) {
	delete(s.reqs, r.id)
	keep := request{tokens: r.tokens[:0], tabs: r.tabs, gs: r.gs, view: r.view}
	for g := range keep.tabs {
		keep.tabs[g] = keep.tabs[g][:0]
		keep.view[g] = nil
		gs := &keep.gs[g]
		shown := gs.shown
		if shown != nil {
			shown = shown[:0]
		}
		*gs = reqGroup{retired: gs.retired[:0], shown: shown}
	}
	if r.plain {
		keep.chain, keep.plain = r.chain, true
	}
	*r = keep
	if len(s.spare) < maxSpare {
		s.spare = append(s.spare, r)
	}
}

// Step plans the next step: it schedules running requests (decodes first,
// then prefill chunks) within the token budget, preempting the newest
// running requests when blocks run out, admits waiting requests in arrival
// order (local prefix hit first, the connector's match beyond it, exactly
// the blocks that needs), tells the connector what runs, and returns the
// plan with the connector's Metadata. The engine computes the plan and
// then calls Done; Step returns [ErrStepInFlight] until it does.
//
// A request whose connector call fails ends Failed, with the error in its
// [Ended] record; Step itself fails only when called out of turn.
func (s *Scheduler) Step() (*Plan, error) {
	if s.inFlight {
		return nil, fmt.Errorf("%w: Step called before Done of step %d", ErrStepInFlight, s.step)
	}
	s.step++
	// What ends while this step is planned (a failed Scheduled, say)
	// frees room for the next one: news for Idle.
	s.news = false
	p := &s.plan
	p.Step = s.step
	p.Items = p.Items[:0]
	clear(s.items)
	s.items = s.items[:0]
	p.Preempted = p.Preempted[:0]
	p.Metadata = nil
	budget := s.cfg.MaxBatchedTokens
	starved := false

	// Running requests: decodes first, then prefill chunks, each pass in
	// arrival order.
	for pass := range 2 {
		for i := 0; i < len(s.running) && budget > 0; i++ {
			r := s.running[i]
			left := len(r.tokens) - r.computed
			if r.planned == s.step || (left == 1) != (pass == 0) {
				continue
			}
			n := s.chunk(r.computed, min(left, budget), len(r.tokens))
			if n == 0 {
				continue // the budget left does not reach a block boundary
			}
			if !s.grow(r, r.computed+n) {
				if r.state != Running {
					i-- // r failed: it left the queue
				}
				continue
			}
			s.addItem(r, n)
			budget -= n
		}
	}

	// Waiting requests, in arrival order, unless a running request waits
	// for blocks: it has them first.
	for _, r := range s.running {
		if r.planned != s.step {
			starved = true
			break
		}
	}
	if !starved {
		s.admit(&budget)
	}

	// Tell the connector what runs, now that no plan decision can change.
	if s.conn != nil && !s.detached {
		k := 0
		for i, it := range p.Items {
			r := s.items[i]
			r.known = true
			s.sweep(r)
			s.hide(r, it.End)
			err := s.conn.Scheduled(&r.creq, it.End, r.tables()...)
			s.named(r)
			if err != nil {
				r.planned = 0
				s.end(r, Failed, fmt.Errorf("%w: Scheduled(%q): %w", ErrConnector, r.id, err))
				continue
			}
			r.item = k
			p.Items[k] = it
			s.items[k] = r
			k++
		}
		clear(p.Items[k:])
		clear(s.items[k:])
		p.Items = p.Items[:k]
		s.items = s.items[:k]
	}
	if s.conn != nil {
		p.Metadata = s.conn.Plan()
		s.busy.plan(p.Metadata)
		s.ranks.ship(p.Metadata)
	}
	s.inFlight = true
	s.stats.Step = s.step
	return p, nil
}

func (s *Scheduler) addItem(r *request, n int) {
	r.planned = s.step
	r.item = len(s.plan.Items)
	end := r.computed + n
	st := noState
	if s.align {
		st = s.stateEntries(r.computed, end, len(r.tokens))
	}
	s.plan.Items = append(s.plan.Items, Item{
		ID:     r.id,
		Start:  r.computed,
		End:    end,
		Tokens: r.tokens[:end],
		Blocks: r.tabs[0],
		Tables: r.tabs,
		State:  st,
		Sample: end == len(r.tokens),
	})
	s.items = append(s.items, r)
}

// chunk returns how many of the n tokens after computed, of a request of
// total tokens, a prefill chunk computes. With a state group a chunk that
// does not reach the last token ends at a block boundary, so that the
// state it leaves is one a prefix cache can keep: n rounds down to one,
// maybe to 0.
func (s *Scheduler) chunk(computed, n, total int) int {
	if !s.align || computed+n == total || s.mut == mutNoAlign {
		return n
	}
	return max(0, (computed+n)/s.bs*s.bs-computed)
}

// stateEntries returns the state entries of an item computing [start, end)
// of a request of total tokens (see StateEntries). The state after end
// stays at the entry of its block; an item that reaches the last token
// also keeps the state at the last block boundary before it, where a
// prefix cache may resume the same prompt (never at its last token).
func (s *Scheduler) stateEntries(start, end, total int) StateEntries {
	e := StateEntries{In: -1, Snapshot: -1, Out: (end - 1) / s.bs}
	if start > 0 {
		e.In = (start - 1) / s.bs
	}
	if k := (end - 1) / s.bs; end == total && k*s.bs > start && k-1 != e.Out {
		e.Snapshot = k - 1
	}
	if s.mut == mutStateOffByOne && end%s.bs == 0 {
		e.Out = end / s.bs // the state at a boundary, kept as the one after the next block
	}
	return e
}

// grow gives running request r blocks for tokens positions, in every
// group. When a pool lacks blocks it preempts the newest running requests
// that are newer than r and not planned in this step, unless blocks that
// the connector keeps will cover the need once released; then r waits. It
// reports whether r has its blocks; r fails if it alone outgrew a pool.
func (s *Scheduler) grow(r *request, tokens int) bool {
	if !s.growNeed(r, tokens) {
		return true
	}
	for !s.fits() {
		if s.pending() {
			return false
		}
		v := s.victim(r)
		if v == nil {
			for g := range s.groups {
				if r.gs[g].refs+s.need[g] > s.pools[g].Len() {
					s.end(r, Failed, fmt.Errorf("%w: request %q needs %d blocks%s for %d tokens, the pool has %d", ErrTooLarge, r.id, r.gs[g].refs+s.need[g], s.groupName(g), tokens, s.pools[g].Len()))
					break
				}
			}
			return false
		}
		s.preempt(v)
		s.plan.Preempted = append(s.plan.Preempted, v.id)
	}
	s.extend(r, tokens)
	return true
}

// growNeed sets s.need[g] to the blocks group g's table of r lacks for r
// to compute from r.computed up to end, and reports whether any lacks one.
func (s *Scheduler) growNeed(r *request, end int) bool {
	nb := s.blocksFor(end)
	some := false
	for g, gr := range s.groups {
		t := r.tabs[g]
		n := 0
		if gr.kind == hashing.RecurrentState {
			e := s.stateEntries(r.computed, end, len(r.tokens))
			if lacks(t, e.Snapshot) {
				n++
			}
			if lacks(t, e.Out) {
				n++
			}
		} else {
			for j := r.computed / s.bs; j < nb; j++ {
				if lacks(t, j) {
					n++
				}
			}
		}
		s.need[g] = n
		some = some || n > 0
	}
	return some
}

// lacks reports whether entry j >= 0 of t has no block.
func lacks(t []BlockID, j int) bool { return j >= 0 && (j >= len(t) || t[j] == connector.NoBlock) }

// fits reports whether every pool has the blocks s.need asks of it.
func (s *Scheduler) fits() bool {
	for g, n := range s.need {
		if n > s.pools[g].Available() {
			return false
		}
	}
	return true
}

// pending reports whether blocks that held requests alone hold will cover
// s.need once the connector releases them.
func (s *Scheduler) pending() bool {
	for g, n := range s.need {
		if n > s.pools[g].Available()+s.pendingFree[g] {
			return false
		}
	}
	return true
}

// extend gives r, in every group, the blocks it needs to compute from
// r.computed up to end (see growNeed), which the pools must have.
func (s *Scheduler) extend(r *request, end int) {
	nb := s.blocksFor(end)
	for g, gr := range s.groups {
		if gr.kind == hashing.RecurrentState {
			e := s.stateEntries(r.computed, end, len(r.tokens))
			s.pad(r, g, max(nb, e.Out+1))
			s.fill(r, g, e.Snapshot)
			s.fill(r, g, e.Out)
			continue
		}
		s.pad(r, g, nb)
		for j := r.computed / s.bs; j < nb; j++ {
			s.fill(r, g, j)
		}
	}
}

// extendLoad gives r, which holds a local hit of hit blocks, the blocks a
// load of the blocks up to p needs: every one after the hit for full
// attention, the window before p for a sliding window, the state at p for
// a state group; the entries between stay NoBlock.
func (s *Scheduler) extendLoad(r *request, hit, p int) {
	for g, gr := range s.groups {
		s.pad(r, g, p)
		lo := hit
		switch gr.kind {
		case hashing.SlidingWindow:
			lo = max(hit, s.windowFirst(g, p*s.bs))
		case hashing.RecurrentState:
			lo = p - 1
		}
		for j := lo; j < p; j++ {
			s.fill(r, g, j)
		}
	}
}

// loadNeed returns the blocks extendLoad takes from group g's pool.
func (s *Scheduler) loadNeed(g, hit, p int) int {
	switch s.groups[g].kind {
	case hashing.SlidingWindow:
		return p - max(hit, s.windowFirst(g, p*s.bs))
	case hashing.RecurrentState:
		return 1
	}
	return p - hit
}

// windowFirst returns the first block that sliding-window group g needs
// to compute position c: the block holding token c-W+1 (a token attends
// to itself and the W-1 before it), or 0.
func (s *Scheduler) windowFirst(g, c int) int {
	first := c - s.groups[g].window + 1
	if first <= 0 {
		return 0
	}
	return first / s.bs
}

// pad extends group g's table of r with NoBlock entries to n entries.
func (s *Scheduler) pad(r *request, g, n int) {
	for len(r.tabs[g]) < n {
		r.tabs[g] = append(r.tabs[g], connector.NoBlock)
	}
	if sh := &r.gs[g].shown; *sh != nil {
		for len(*sh) < n {
			*sh = append(*sh, connector.NoBlock)
		}
	}
}

// fill gives entry j >= 0 of group g's table of r a new block, unless it
// has one. The pool must have one.
func (s *Scheduler) fill(r *request, g, j int) {
	if j < 0 || r.tabs[g][j] != connector.NoBlock {
		return
	}
	var err error
	s.hits, err = s.pools[g].Allocate(s.hits[:0], 1)
	if err != nil {
		panic("scheduler: " + err.Error()) // the caller checked the need
	}
	s.setEntry(r, g, j, s.hits[0])
	r.gs[g].refs++
}

// setEntry sets entry j of group g's table of r, in the shown view too.
func (s *Scheduler) setEntry(r *request, g, j int, b BlockID) {
	r.tabs[g][j] = b
	if sh := r.gs[g].shown; sh != nil {
		sh[j] = b
	}
}

// hide, before r is handed to Scheduled for a step that ends at end,
// hides from the connector the sliding-window blocks that the step
// computes and that fall out of the window by its end: the step needs
// them, but no later one does, and a block the connector never saw is
// freed as soon as it leaves the window, while one it saw is held until
// the request's blocks are released (a save may read it until then). A
// step that reaches r's last token shows the window before the last block
// boundary before that token too: a prefix cache resumes the same prompt
// there (as it does the state, see stateEntries).
func (s *Scheduler) hide(r *request, end int) {
	point := end
	if end == len(r.tokens) {
		point = (end - 1) / s.bs * s.bs
	}
	for g, gr := range s.groups {
		if gr.kind != hashing.SlidingWindow {
			continue
		}
		gs := &r.gs[g]
		ws := s.windowFirst(g, point)
		for j := max(gs.hidden, gs.named); j < ws && j < len(gs.shown); j++ {
			gs.shown[j] = connector.NoBlock
		}
		gs.hidden = max(gs.hidden, ws)
	}
}

// named records that the connector was handed r's tables in Scheduled,
// which saves their full blocks.
func (s *Scheduler) named(r *request) {
	for g := range r.gs {
		if r.gs[g].shown != nil {
			r.gs[g].named = max(r.gs[g].named, len(r.gs[g].shown))
		}
	}
}

// victim returns the newest running request that is newer than r and not
// planned in this step, or nil.
func (s *Scheduler) victim(r *request) *request {
	for j := len(s.running) - 1; j >= 0; j-- {
		v := s.running[j]
		if v.seq <= r.seq {
			return nil
		}
		if v.planned != s.step {
			return v
		}
	}
	return nil
}

// localHit returns the longest local prefix-cache hit of r within limit
// blocks: the longest block boundary p that every group can resume from
// with blocks the pools index (full attention: every block before p; a
// sliding window: those that hold the window before p; a state group: the
// state after block p-1), the rule the connector follows for the store.
// It leaves in s.hitTabs[g] the first p entries of group g's table, the
// blocks to take and NoBlock for the ones resuming does not need.
func (s *Scheduler) localHit(r *request, limit int) int {
	hashes := r.hashes()[:limit]
	if s.plain {
		s.hitTabs[0] = s.pools[0].Lookup(s.ns, hashes, s.hitTabs[0][:0])
		return len(s.hitTabs[0])
	}
	end := limit
	for g, gr := range s.groups {
		s.hitTabs[g] = s.hitTabs[g][:0]
		if gr.kind == hashing.FullAttention {
			s.hitTabs[g] = s.pools[g].Lookup(s.ns, hashes[:end], s.hitTabs[g])
			end = len(s.hitTabs[g])
		}
	}
	p := end
	for ; p > 0 && !s.resumable(hashes, p); p-- {
	}
	for g, gr := range s.groups {
		t := s.hitTabs[g]
		switch gr.kind {
		case hashing.FullAttention:
			t = t[:p]
		case hashing.SlidingWindow:
			ws := s.windowFirst(g, p*s.bs)
			for j := 0; j < p; j++ {
				b := connector.NoBlock
				if j >= ws {
					b, _ = s.pools[g].find(s.ns, hashes[j])
				}
				t = append(t, b)
			}
		case hashing.RecurrentState:
			for j := 0; j < p-1; j++ {
				t = append(t, connector.NoBlock)
			}
			if p > 0 {
				b, _ := s.pools[g].find(s.ns, hashes[p-1])
				t = append(t, b)
			}
		}
		s.hitTabs[g] = t
	}
	return p
}

// resumable reports whether the pools of the sliding-window and state
// groups index what resuming at block boundary p needs.
func (s *Scheduler) resumable(hashes []hashing.BlockHash, p int) bool {
	for g, gr := range s.groups {
		lo := p
		switch gr.kind {
		case hashing.SlidingWindow:
			lo = s.windowFirst(g, p*s.bs)
		case hashing.RecurrentState:
			lo = p - 1
		}
		for j := lo; j < p; j++ {
			if _, ok := s.pools[g].find(s.ns, hashes[j]); !ok {
				return false
			}
		}
	}
	return true
}

// admit admits waiting requests in arrival order while budget and blocks
// last. A lookup-pending request is skipped, never waited for.
func (s *Scheduler) admit(budget *int) {
	lookups := s.lookups()
	for i := 0; i < len(s.waiting) && *budget > 0; i++ {
		if s.cfg.MaxRunning > 0 && len(s.running)+len(s.loading) >= s.cfg.MaxRunning {
			return
		}
		r := s.waiting[i]
		if err := s.fitsPools(len(r.tokens)); err != nil {
			s.end(r, Failed, fmt.Errorf("%w: request %q: %w", ErrTooLarge, r.id, err))
			i--
			continue
		}
		// Never the last token: the engine must compute one to sample.
		limit := min((len(r.tokens)-1)/s.bs, len(r.hashes()))
		if s.mut == mutLastToken {
			limit = min(len(r.tokens)/s.bs, len(r.hashes()))
		}
		hit := 0
		if s.cfg.PrefixCaching {
			hit = s.localHit(r, limit)
		} else {
			for g := range s.hitTabs {
				s.hitTabs[g] = s.hitTabs[g][:0]
			}
		}
		ext := 0
		if lookups {
			r.known = true
			r.creq.Prompt = len(r.tokens)
			m, err := s.conn.Match(&r.creq, hit*s.bs)
			switch {
			case err != nil:
				err = fmt.Errorf("%w: Match(%q): %w", ErrConnector, r.id, err)
			case m.Pending:
				r.state = LookupPending
				if s.mut == mutPendingBlocks {
					return
				}
				continue
			case m.Tokens < 0 || m.Tokens%s.bs != 0 || hit*s.bs+m.Tokens > limit*s.bs:
				err = fmt.Errorf("%w: Match(%q, %d) = %d tokens, want a multiple of %d within %d", ErrConnector, r.id, hit*s.bs, m.Tokens, s.bs, limit*s.bs-hit*s.bs)
			}
			if err != nil {
				s.end(r, Failed, err)
				i--
				continue
			}
			r.state = Waiting
			ext = m.Tokens
		}
		total := hit*s.bs + ext
		n := 0 // tokens computed this step
		// A layer-wise engine computes the request in the step of its
		// load, if the budget starts its prefill.
		inline := ext > 0 && s.cfg.LayerwiseLoads && s.plain && s.conn != nil
		if ext == 0 || inline {
			n = s.chunk(total, min(len(r.tokens)-total, *budget), len(r.tokens))
			switch {
			case n > 0:
				total += n
			case ext == 0:
				return // the budget left reaches no block boundary; first come, first served
			default:
				inline = false
			}
		}
		// The blocks each group needs beyond the hit, against what its
		// pool has once the hit's cached blocks leave the LRU list.
		for g := range s.groups {
			switch {
			case inline:
				s.need[g] = s.blocksFor(total) - hit
			case ext > 0:
				s.need[g] = s.loadNeed(g, hit, hit+ext/s.bs)
			case s.groups[g].kind == hashing.RecurrentState:
				e := s.stateEntries(hit*s.bs, total, len(r.tokens))
				s.need[g] = 1
				if e.Snapshot >= 0 {
					s.need[g]++
				}
			case s.mut == mutOverReserve:
				s.need[g] = s.blocksFor(max(len(r.tokens), total)) - hit
			default:
				s.need[g] = s.blocksFor(total) - hit
			}
			s.avail[g] = s.pools[g].Available()
			for _, b := range s.hitTabs[g] {
				if b != connector.NoBlock && s.pools[g].Refs(b) == 0 {
					s.avail[g]-- // a cached hit leaves the LRU list when referenced
				}
			}
		}
		for g, n := range s.need {
			if n > s.avail[g] {
				return // first come, first served: later requests wait too
			}
		}
		for g := range s.groups {
			r.tabs[g] = r.tabs[g][:0]
			if sh := &r.gs[g].shown; *sh != nil {
				*sh = (*sh)[:0]
			}
			s.pad(r, g, hit)
			for j, b := range s.hitTabs[g] {
				if b == connector.NoBlock {
					continue
				}
				if err := s.pools[g].Ref(b); err != nil {
					panic("scheduler: " + err.Error()) // Lookup returned it
				}
				s.setEntry(r, g, j, b)
				r.gs[g].refs++
			}
		}
		r.local, r.computed, r.committed = hit*s.bs, hit*s.bs, hit
		switch {
		case inline:
			s.extend(r, total)
		case ext > 0:
			s.extendLoad(r, hit, hit+ext/s.bs)
		case s.mut == mutOverReserve:
			s.extend(r, total)
			for g, gr := range s.groups {
				if gr.kind != hashing.RecurrentState {
					s.pad(r, g, s.blocksFor(len(r.tokens)))
					for j := hit; j < s.blocksFor(len(r.tokens)); j++ {
						s.fill(r, g, j)
					}
				}
			}
		default:
			s.extend(r, total)
		}
		s.waiting.remove(r)
		i--
		r.m.LocalTokens += hit * s.bs
		s.stats.LocalTokens += int64(hit * s.bs)
		s.stats.Admitted++
		if lookups {
			err := s.conn.Allocated(&r.creq, ext, r.tables()...)
			if err != nil {
				s.end(r, Failed, fmt.Errorf("%w: Allocated(%q, %d external tokens): %w", ErrConnector, r.id, ext, err))
				continue
			}
		}
		if inline {
			r.inline, r.external = true, ext
			r.computed += ext // the item starts after the KV it loads
			s.stats.InlineLoads++
		} else if ext > 0 {
			r.state = Loading
			r.external = ext
			s.loading.insert(r)
			continue
		}
		r.state = Running
		s.running.insert(r)
		s.addItem(r, n)
		*budget -= n
	}
}

// preempt takes a running or loading request back to waiting: it ends the
// request in the connector and frees its blocks, or holds them until the
// connector releases them.
func (s *Scheduler) preempt(r *request) {
	switch r.state {
	case Running:
		s.running.remove(r)
	case Loading:
		s.loading.remove(r)
	}
	r.m.Preemptions++
	s.stats.Preemptions++
	r.state = Preempted
	keep, err := s.finishConn(r, true)
	if err != nil {
		s.endDetached(r, Failed, err, keep)
		return
	}
	if keep && s.mut != mutRequeueEarly {
		s.hold(r)
		return
	}
	s.releaseBlocks(r)
	s.requeue(r)
}

// finishConn calls the connector's Finish for r if it knows r, or its
// Preempt (connector.Preempter) when r is preempted and the connector has it.
func (s *Scheduler) finishConn(r *request, preempted bool) (keep bool, err error) {
	if !r.known || s.conn == nil {
		return false, nil
	}
	r.known = false
	op := "Finish"
	if p, ok := s.conn.(connector.Preempter); ok && preempted {
		op = "Preempt"
		keep, err = p.Preempt(&r.creq, r.tables()...)
	} else {
		keep, err = s.conn.Finish(&r.creq, r.tables()...)
	}
	if err != nil {
		return false, fmt.Errorf("%w: %s(%q): %w", ErrConnector, op, r.id, err)
	}
	return keep && s.mut != mutIgnoreKeep, nil
}

func (s *Scheduler) hold(r *request) {
	r.held = true
	s.held++
	r.exclusive = 0
	for g := range r.gs {
		gs := &r.gs[g]
		gs.exclusive = 0
		for _, list := range [2][]BlockID{r.tabs[g], gs.retired} {
			for _, b := range list {
				if b != connector.NoBlock && s.pools[g].Refs(b) == 1 {
					gs.exclusive++
				}
			}
		}
		s.pendingFree[g] += gs.exclusive
		r.exclusive += gs.exclusive
	}
}

// unhold undoes hold's count, when the connector releases r's blocks.
func (s *Scheduler) unhold(r *request) {
	r.held = false
	s.held--
	for g := range r.gs {
		s.pendingFree[g] -= r.gs[g].exclusive
		r.gs[g].exclusive = 0
	}
	r.exclusive = 0
}

func (s *Scheduler) releaseBlocks(r *request) {
	for g := range r.gs {
		gs := &r.gs[g]
		t := r.tabs[g]
		// Last first, one at a time past the NoBlock entries: the tail is
		// evicted before the head, which more requests share.
		for _, list := range [2][]BlockID{gs.retired, t} {
			for j := len(list) - 1; j >= 0; j-- {
				if list[j] == connector.NoBlock {
					continue
				}
				if err := s.pools[g].Release(list[j : j+1]); err != nil {
					panic("scheduler: " + err.Error()) // the request held each block once
				}
			}
		}
		if g == 0 && s.mut == mutDoubleRelease && len(t) > 0 && t[0] != connector.NoBlock && s.pools[0].Refs(t[0]) > 0 {
			if err := s.pools[0].Release(t[:1]); err != nil { // the deliberate bug
				panic("scheduler: " + err.Error())
			}
		}
		r.tabs[g] = t[:0]
		shown := gs.shown
		if shown != nil {
			shown = shown[:0]
		}
		*gs = reqGroup{retired: gs.retired[:0], shown: shown}
	}
	r.computed, r.committed, r.local, r.external = 0, 0, 0, 0
}

// requeue puts a preempted request whose blocks are free back in line.
func (s *Scheduler) requeue(r *request) {
	r.state = Waiting
	s.waiting.insert(r)
}

// end ends r in state (Finished, Failed or Aborted): the connector's Finish
// decides whether its blocks are freed now or held until released.
func (s *Scheduler) end(r *request, state State, err error) {
	s.news = true // its blocks, or its place in MaxRunning, go to others
	keep := r.held
	if !r.held {
		var ferr error
		keep, ferr = s.finishConn(r, false)
		if ferr != nil && err == nil {
			state, err = Failed, ferr
		}
	}
	s.endDetached(r, state, err, keep)
}

// endDetached ends r once the connector was told; keep says whether its
// blocks wait for a release.
func (s *Scheduler) endDetached(r *request, state State, err error, keep bool) {
	switch r.state {
	case Waiting, LookupPending:
		s.waiting.remove(r)
	case Running:
		s.running.remove(r)
	case Loading:
		s.loading.remove(r)
	}
	r.state, r.err = state, err
	r.m.EndStep = s.step
	switch state {
	case Finished:
		s.stats.Finished++
	case Failed:
		s.stats.Failed++
	case Aborted:
		s.stats.Aborted++
	}
	s.ended = append(s.ended, Ended{ID: r.id, State: state, Err: err, Metrics: r.m})
	switch {
	case r.held:
	case keep:
		s.hold(r)
	default:
		s.releaseBlocks(r)
		s.forget(r)
	}
}

// Done completes the step that the last Step planned: results carries the
// token sampled for every item with Sample set (in any order; Finished ends
// the request), outs the Outputs the workers reported since the last Done
// (nil without a connector). Done hands outs to the connector's Update and
// acts on its Progress: loaded requests become runnable, failed loads roll
// their request back to the last valid block and recompute the rest (or
// fail it, under the fail policy), released blocks are freed and released
// preempted requests wait again.
//
// A result for a request the plan does not sample, a second one for the
// same request, a missing one, or an error of the connector's Update
// returns an error and changes nothing: call Done again. An error wrapping
// [ErrConnector] after that means the connector reported something
// inconsistent, which the scheduler ignored; the step is then done. So
// is it after a *[RankLostError] (see Config.RankSteps): a worker rank's
// Outputs did not come, and its transfers were written off.
func (s *Scheduler) Done(results []Result, outs []*connector.Output) error {
	if !s.inFlight {
		return fmt.Errorf("%w: Done called without a Step (last step %d)", ErrNoStep, s.step)
	}
	s.discarded = s.discarded[:0]
	if s.conn == nil && len(outs) > 0 {
		return fmt.Errorf("%w: Done got %d Outputs but the scheduler has no connector", ErrBadResult, len(outs))
	}
	s.epoch++
	want := 0
	for i := range s.plan.Items {
		if s.plan.Items[i].Sample {
			want++
		}
	}
	clear(s.results)
	s.results = s.results[:0]
	next := 0 // the item a result in plan order would name
	for i := range results {
		res := &results[i]
		// Results usually come in plan order: find the request without
		// the map.
		for next < len(s.plan.Items) && !s.plan.Items[next].Sample {
			next++
		}
		var r *request
		if next < len(s.plan.Items) && s.plan.Items[next].ID == res.ID {
			r = s.items[next]
			next++
		} else {
			r = s.reqs[res.ID]
		}
		switch {
		case r == nil:
			return fmt.Errorf("%w: Done: results[%d] names request %q", ErrUnknownRequest, i, res.ID)
		case r.state.Ended():
			return fmt.Errorf("%w: Done: results[%d] names request %q, which is %v", ErrEnded, i, res.ID, r.state)
		case r.planned != s.step || !s.plan.Items[r.item].Sample:
			return fmt.Errorf("%w: Done: results[%d] names request %q, which samples nothing in step %d", ErrBadResult, i, res.ID, s.step)
		case r.seen == s.epoch:
			return fmt.Errorf("%w: Done: results[%d] names request %q a second time", ErrBadResult, i, res.ID)
		}
		r.seen = s.epoch
		s.results = append(s.results, r)
	}
	if len(results) != want {
		for i := range s.plan.Items {
			if s.plan.Items[i].Sample && s.items[i].seen != s.epoch {
				return fmt.Errorf("%w: Done: no result for request %q, which samples in step %d (%d results, want %d)", ErrBadResult, s.plan.Items[i].ID, s.step, len(results), want)
			}
		}
	}
	var prog *connector.Progress
	if s.conn != nil {
		var err error
		if prog, err = s.conn.Update(outs); err != nil {
			return fmt.Errorf("%w: Update: %w", ErrConnector, err)
		}
		s.busy.done(outs)
		s.ranks.report(outs, s.step)
	}
	s.inFlight = false
	bad := s.resolveInline(prog)

	// The step's compute is done: advance every planned request.
	for i := range s.plan.Items {
		it := &s.plan.Items[i]
		r := s.items[i]
		if r.discard {
			continue
		}
		r.computed = it.End
		r.m.ComputedTokens += it.End - it.Start
		s.stats.ComputedTokens += int64(it.End - it.Start)
		s.commit(r)
	}
	if prog != nil {
		bad = errors.Join(bad, s.progress(prog))
	}
	for i := range results {
		res := &results[i]
		r := s.results[i]
		if r.discard {
			continue // computed over KV that did not load
		}
		r.tokens = append(r.tokens, res.Token)
		s.scratch = r.chain.Append(s.scratch[:0], res.Token)
		r.creq.Hashes = r.chain.Hashes()
		r.creq.Tokens = r.tokens
		r.creq.Prompt = len(r.tokens)
		r.m.Generated++
		if r.m.FirstToken == 0 {
			r.m.FirstToken = s.step
		}
		if res.Finished {
			s.end(r, Finished, nil)
		}
	}
	s.rollBack()
	if r, ok := s.ranks.lost(s.step); ok {
		bad = errors.Join(bad, s.loseRank(r))
	}
	return bad
}

// Discarded returns the requests whose work in the step the last Done
// call ended it threw away, because they ran in the step of a load that
// failed or went unreported (Config.LayerwiseLoads): the engine drops the
// tokens it sampled for them in that step, which Done did not count. It
// is empty after a Done that changed nothing. Owned by the Scheduler,
// valid until the next Done.
func (s *Scheduler) Discarded() []connector.RequestID { return s.discarded }

// resolveInline acts on the loads of the step's inline requests (Config.
// LayerwiseLoads), before their compute counts: a load done makes the
// step's work valid; a failed one marks the request's work discarded
// (rollBack rolls it back), as does a load the Progress does not report,
// which the workers' Outputs should have (the Poll after WaitLayer of the
// last layer reports every load): that is an error wrapping ErrConnector.
func (s *Scheduler) resolveInline(prog *connector.Progress) error {
	var bad []error
	for _, r := range s.items {
		if !r.inline {
			continue
		}
		r.inline = false
		r.discard, r.valid = true, r.local
		if prog == nil {
			r.awaitLoad = true
			continue
		}
		if slices.Contains(prog.Loaded, r.id) {
			r.discard = false
			r.m.ExternalTokens += r.external
			s.stats.ExternalTokens += int64(r.external)
			r.external = 0
			continue
		}
		i := slices.IndexFunc(prog.Failed, func(f connector.LoadFailure) bool { return f.Req == r.id })
		if i < 0 {
			// The load may still be writing into its blocks: the request
			// waits for it as a whole load does.
			r.awaitLoad = true
			bad = append(bad, fmt.Errorf("the Outputs of step %d report no end of the layer-wise load of request %q: its work of the step is discarded, and it waits for the load", s.step, r.id))
			continue
		}
		f := prog.Failed[i]
		r.m.LoadFailures++
		s.stats.LoadFailures++
		switch {
		case f.Valid < r.local || f.Valid > r.local+r.external || f.Valid%s.bs != 0:
			bad = append(bad, fmt.Errorf("Progress.Failed: request %q valid = %d tokens, want a multiple of %d in [%d, %d]", f.Req, f.Valid, s.bs, r.local, r.local+r.external))
		case f.Fail:
			r.failLoad = true
			r.valid = f.Valid
		default:
			r.valid = f.Valid
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %w", ErrConnector, errors.Join(bad...))
	}
	return nil
}

// rollBack takes each request whose work of the step was discarded back
// to the KV that survived its load, or fails it under PolicyFail. Its
// blocks stay: the next steps recompute the rest into them.
func (s *Scheduler) rollBack() {
	for _, r := range s.items {
		if !r.discard {
			continue
		}
		s.discarded = append(s.discarded, r.id)
		s.stats.DiscardedSteps++
		r.discard = false
		if r.awaitLoad {
			// The blocks after the load's held only the discarded work,
			// which no connector saves (see connector.LayerWorker): they
			// go back to the pool, as a whole load holds none.
			r.awaitLoad = false
			r.computed = r.local
			p := (r.local + r.external) / s.bs
			t := r.tabs[0]
			for j := len(t) - 1; j >= p; j-- {
				if err := s.pools[0].Release(t[j : j+1]); err != nil {
					panic("scheduler: " + err.Error()) // r holds the block
				}
				r.gs[0].refs--
			}
			r.tabs[0] = t[:p]
			s.running.remove(r)
			r.state = Loading
			s.loading.insert(r)
			continue
		}
		if r.failLoad {
			r.failLoad = false
			s.end(r, Failed, fmt.Errorf("%w: request %q: %d of %d tokens valid", ErrLoadFailed, r.id, r.valid, r.local+r.external))
			continue
		}
		r.m.ExternalTokens += r.valid - r.local
		s.stats.ExternalTokens += int64(r.valid - r.local)
		r.computed = r.valid
		r.external = 0
		s.commit(r)
	}
}

// commit indexes r's full computed blocks in the prefix cache, in every
// group: the entries that hold a block (a state group's only where its
// state was kept, at the end of the block), then frees the sliding-window
// blocks that fell out of the window.
func (s *Scheduler) commit(r *request) {
	full := min(r.computed/s.bs, len(r.hashes()))
	if !s.cfg.PrefixCaching {
		r.committed = max(r.committed, full)
	}
	for ; r.committed < full; r.committed++ {
		j := r.committed
		for g := range s.groups {
			b := connector.NoBlock
			if j < len(r.tabs[g]) {
				b = r.tabs[g][j]
			}
			if b == connector.NoBlock {
				continue
			}
			if _, err := s.pools[g].Commit(b, s.ns, r.hashes()[j]); err != nil {
				panic("scheduler: " + err.Error()) // r holds the block
			}
		}
	}
	s.retire(r)
}

// retire drops from r's sliding-window tables the blocks that no position
// from r.computed on attends to: the entry becomes NoBlock, and the block
// goes back to the pool (cached, if committed), or, if the connector was
// shown it, waits in r's retired list until sweep frees it or r's blocks
// are released.
func (s *Scheduler) retire(r *request) {
	if s.mut == mutKeepWindow {
		return
	}
	for g, gr := range s.groups {
		if gr.kind != hashing.SlidingWindow {
			continue
		}
		gs := &r.gs[g]
		t := r.tabs[g]
		ws := s.windowFirst(g, r.computed)
		if s.mut == mutWindowShort {
			ws = s.windowFirst(g, r.computed+1) // a token short: the window's first block may go
		}
		ws = min(ws, len(t))
		for j := gs.low; j < ws; j++ {
			b := t[j]
			if b == connector.NoBlock {
				continue
			}
			if j < gs.named && gs.shown[j] != connector.NoBlock {
				gs.retired = append(gs.retired, b)
			} else {
				if err := s.pools[g].Release(t[j : j+1]); err != nil {
					panic("scheduler: " + err.Error()) // r holds the block
				}
				gs.refs--
			}
			s.setEntry(r, g, j, connector.NoBlock)
		}
		gs.low = max(gs.low, ws)
	}
}

// sweep frees the retired sliding-window blocks of r that no unfinished
// transfer names. It runs just before r's tables go to Scheduled, whose
// NoBlock entries tell the connector that the blocks are gone before its
// next Plan: a retry it plans then skips them (see "Block tables" in
// package connector). A block freed here is reused in a later step.
func (s *Scheduler) sweep(r *request) {
	for g, gr := range s.groups {
		if gr.kind != hashing.SlidingWindow {
			continue
		}
		gs := &r.gs[g]
		kept := gs.retired[:0]
		for i, b := range gs.retired {
			if s.busy.named(g, b) && s.mut != mutFreeBusy {
				kept = append(kept, b)
				continue
			}
			// kept has not reached i yet: entry i still holds b.
			if err := s.pools[g].Release(gs.retired[i : i+1]); err != nil {
				panic("scheduler: " + err.Error()) // r holds the block
			}
			gs.refs--
		}
		clear(gs.retired[len(kept):])
		gs.retired = kept
	}
}

// progress acts on the connector's Progress. It returns an error wrapping
// ErrConnector for entries that contradict the scheduler's state, which it
// skips.
func (s *Scheduler) progress(p *connector.Progress) error {
	if (len(p.Loaded) > 0 || len(p.Failed) > 0 || len(p.Released) > 0) && s.mut != mutIdleNoNews {
		s.news = true
	}
	var bad []error
	for _, id := range p.Loaded {
		r := s.reqs[id]
		switch {
		case r == nil:
			bad = append(bad, fmt.Errorf("Progress.Loaded names unknown request %q", id))
		case r.state != Loading:
			// Preempted, aborted or invalidated while loading: the
			// blocks wait for the release, their content is not used.
		default:
			s.loaded(r, r.local+r.external)
		}
	}
	for _, f := range p.Failed {
		r := s.reqs[f.Req]
		switch {
		case r == nil:
			bad = append(bad, fmt.Errorf("Progress.Failed names unknown request %q", f.Req))
			continue
		case r.state != Loading:
			continue
		}
		r.m.LoadFailures++
		s.stats.LoadFailures++
		valid := f.Valid
		if valid < r.local || valid > r.local+r.external || valid%s.bs != 0 {
			bad = append(bad, fmt.Errorf("Progress.Failed: request %q valid = %d tokens, want a multiple of %d in [%d, %d]", f.Req, f.Valid, s.bs, r.local, r.local+r.external))
			valid = r.local
		}
		if f.Fail {
			s.end(r, Failed, fmt.Errorf("%w: request %q: %d of %d tokens valid", ErrLoadFailed, r.id, valid, r.local+r.external))
			continue
		}
		if s.mut == mutTrustFailed {
			valid = r.local + r.external
		}
		s.loaded(r, valid)
	}
	for _, id := range p.Released {
		r := s.reqs[id]
		switch {
		case r == nil:
			bad = append(bad, fmt.Errorf("Progress.Released names unknown request %q", id))
			continue
		case !r.held:
			bad = append(bad, fmt.Errorf("Progress.Released names request %q, whose blocks were not kept (%v)", id, r.state))
			continue
		}
		s.unhold(r)
		s.releaseBlocks(r)
		if r.state == Preempted {
			s.requeue(r)
		} else {
			s.forget(r)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %w", ErrConnector, errors.Join(bad...))
	}
	return nil
}

// loaded makes a loading request runnable with valid tokens of KV: the
// rest of its blocks (failed ones and those after) are recomputed. With
// KV cache groups it resumes at the longest block boundary up to valid
// where its tables hold what every group needs (the local hit's at
// least), and drops the state entries after it, which hold no kept state.
func (s *Scheduler) loaded(r *request, valid int) {
	s.loading.remove(r)
	if !s.plain {
		p := valid / s.bs
		for ; p > r.local/s.bs && !s.resumableAt(r, p); p-- {
		}
		valid = p * s.bs
		for g, gr := range s.groups {
			if gr.kind != hashing.RecurrentState {
				continue
			}
			t := r.tabs[g]
			for j := len(t) - 1; j >= p && j >= 0; j-- {
				if t[j] == connector.NoBlock {
					continue
				}
				if err := s.pools[g].Release(t[j : j+1]); err != nil {
					panic("scheduler: " + err.Error()) // r holds the block
				}
				r.gs[g].refs--
				t[j] = connector.NoBlock
			}
			r.tabs[g] = t[:min(len(t), p)]
		}
	}
	r.m.ExternalTokens += valid - r.local
	s.stats.ExternalTokens += int64(valid - r.local)
	r.computed = valid
	r.external = 0
	s.commit(r)
	r.state = Running
	s.running.insert(r)
}

// resumableAt reports whether r's tables hold what resuming at block
// boundary p needs: every full-attention block before p, the window
// before p of every sliding-window group, the state after block p-1.
func (s *Scheduler) resumableAt(r *request, p int) bool {
	for g, gr := range s.groups {
		lo := 0
		switch gr.kind {
		case hashing.SlidingWindow:
			lo = s.windowFirst(g, p*s.bs)
		case hashing.RecurrentState:
			lo = p - 1
		}
		for j := max(lo, 0); j < p; j++ {
			if lacks(r.tabs[g], j) {
				return false
			}
		}
	}
	return true
}

// Abort ends a request that has not ended: it leaves the queues, the
// connector is told, and its blocks are freed once no transfer touches
// them. Aborting an ended request returns [ErrEnded], an unknown one
// [ErrUnknownRequest]; between Step and Done it returns [ErrStepInFlight].
func (s *Scheduler) Abort(id connector.RequestID) error {
	if s.inFlight {
		return fmt.Errorf("%w: Abort(%q) between Step and Done", ErrStepInFlight, id)
	}
	r := s.reqs[id]
	switch {
	case r == nil:
		return fmt.Errorf("%w: Abort(%q)", ErrUnknownRequest, id)
	case r.state.Ended():
		return fmt.Errorf("%w: Abort(%q): the request is %v", ErrEnded, id, r.state)
	}
	s.end(r, Aborted, nil)
	return nil
}

// Invalidate moves the scheduler to weights generation gen after an online
// weight update: the local prefix cache is dropped (the namespace changes,
// so nothing committed before can hit again), the connector rotates to gen
// if it implements [connector.Rotator], and every running or loading
// request is preempted to recompute, since its KV came from the old
// weights. A connector without Rotator is detached: no lookups and no saves
// from then on, so that it never serves or stores KV of the old
// generation; transfers already running still end normally.
//
// gen must be newer than the current generation ([ErrGeneration]); between
// Step and Done Invalidate returns [ErrStepInFlight]. On error nothing
// changes.
func (s *Scheduler) Invalidate(gen uint64) error {
	if s.inFlight {
		return fmt.Errorf("%w: Invalidate(%d) between Step and Done", ErrStepInFlight, gen)
	}
	if gen <= s.id.Generation {
		return fmt.Errorf("%w: Invalidate(%d), current generation %d", ErrGeneration, gen, s.id.Generation)
	}
	id := s.id
	id.Generation = gen
	ns, err := id.Namespace()
	if err != nil {
		return fmt.Errorf("scheduler: Invalidate(%d): %w", gen, err)
	}
	oldNS := s.ns
	if s.conn != nil && !s.detached && s.mut != mutNoRotate {
		if rot, ok := s.conn.(connector.Rotator); ok {
			if err := rot.Rotate(gen); err != nil {
				return fmt.Errorf("%w: Rotate(%d): %w", ErrConnector, gen, err)
			}
		} else {
			s.detached = true
		}
	}
	s.id, s.ns = id, ns
	if s.mut == mutKeepCache {
		s.ns = oldNS
	} else {
		for _, pool := range s.pools {
			pool.InvalidateAll()
		}
	}
	s.preemptAll()
	return nil
}

// WorkersLost tells the scheduler that the KV memory of its workers is
// lost: a worker process died, say, and the engine restarted it with
// blank memory. With tensor parallelism one rank's loss is every
// request's, since each needs every rank's share of its KV.
//
// outs carries the Outputs of the workers since the last Done: those the
// survivors reported and, for each lost worker, one that lists every
// transfer it was handed and never reported as done, with every block
// failed ([connector.Ledger] keeps them and writes that Output). A transfer
// nobody reports stays in flight in the connector and its blocks stay
// held.
//
// WorkersLost ends the step in flight, if there is one, as a step that
// computed nothing: the next call is Step, not Done. It hands outs to the
// connector's Update and acts on its Progress as Done does, then drops the
// local prefix cache and preempts every running and loading request to
// recompute. The namespace and the connector stay, so what the store holds
// of their prefixes loads again. A load reported failed under the fail
// policy fails its request, as in Done.
//
// On an error of the connector's Update nothing changes: call WorkersLost
// again, with Outputs it accepts.
func (s *Scheduler) WorkersLost(outs []*connector.Output) error {
	if s.conn == nil && len(outs) > 0 {
		return fmt.Errorf("%w: WorkersLost got %d Outputs but the scheduler has no connector", ErrBadResult, len(outs))
	}
	var prog *connector.Progress
	if s.conn != nil {
		var err error
		if prog, err = s.conn.Update(outs); err != nil {
			return fmt.Errorf("%w: WorkersLost: Update: %w", ErrConnector, err)
		}
		s.busy.done(outs)
		s.ranks.report(outs, s.step)
	}
	s.discarded = s.discarded[:0]
	s.epoch++
	if s.inFlight {
		// Nothing of the step counts: its work is gone with the memory.
		s.inFlight = false
		for _, r := range s.items {
			r.discard, r.awaitLoad, r.failLoad = false, false, false
		}
	}
	var bad error
	if prog != nil {
		bad = s.progress(prog)
	}
	for _, pool := range s.pools {
		pool.InvalidateAll()
	}
	s.preemptAll()
	return bad
}

// preemptAll preempts every running and loading request, to recompute.
func (s *Scheduler) preemptAll() {
	for len(s.running) > 0 {
		s.preempt(s.running[len(s.running)-1])
	}
	for len(s.loading) > 0 {
		s.preempt(s.loading[len(s.loading)-1])
	}
	s.news = true
}

// TakeEnded appends to dst the requests that ended since the last call, in
// the order they ended, and returns it.
func (s *Scheduler) TakeEnded(dst []Ended) []Ended {
	dst = append(dst, s.ended...)
	clear(s.ended)
	s.ended = s.ended[:0]
	return dst
}

// Status returns a snapshot of request id, known from Add until it ended
// and its blocks are back in the pool.
func (s *Scheduler) Status(id connector.RequestID) (Status, error) {
	r := s.reqs[id]
	if r == nil {
		return Status{}, fmt.Errorf("%w: Status(%q)", ErrUnknownRequest, id)
	}
	return Status{
		State:    r.state,
		Tokens:   len(r.tokens),
		Computed: r.computed,
		Blocks:   r.blocks(),
		Held:     r.held,
		Metrics:  r.m,
	}, nil
}

// Stats returns the scheduler's occupancy and counters, with the pool's.
func (s *Scheduler) Stats() Stats {
	st := s.stats
	st.Waiting = len(s.waiting)
	st.LookupPending = 0
	for _, r := range s.waiting {
		if r.state == LookupPending {
			st.LookupPending++
		}
	}
	st.Loading = len(s.loading)
	st.Running = len(s.running)
	st.Held = s.held
	st.Pool = PoolStats{}
	for _, pool := range s.pools {
		st.Pool.add(pool.Stats())
	}
	return st
}
