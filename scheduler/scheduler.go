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
// reference step planner, driving a [connector.Scheduler] (or none) in the
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
	pool     *Pool
	conn     connector.Scheduler // nil: local prefix cache only
	detached bool                // Invalidate found no Rotator: no more lookups or saves

	reqs    map[connector.RequestID]*request
	waiting queue // Waiting and LookupPending, in arrival order
	running queue // Running, in arrival order
	loading queue // Loading, in arrival order
	held    int   // requests whose blocks the connector keeps
	spare   []*request

	step        uint64
	inFlight    bool
	epoch       uint64
	nextSeq     uint64
	pendingFree int // blocks that held requests alone hold: free once released

	plan    Plan
	items   []*request // items[i] is the request of plan.Items[i]
	results []*request // results[i] is the request of Done's results[i]
	ended   []Ended
	hits    []BlockID
	scratch []hashing.BlockHash
	stats   Stats
	mut     mutation // a deliberate bug, in the package's tests only
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
	Blocks []BlockID
	// Sample is true when End reaches the request's last known token: the
	// engine samples the next token and reports it in Done.
	Sample bool
}

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
	Pool           PoolStats
}

// New returns a scheduler for cfg driving conn, which may be nil: then the
// scheduler works with its local prefix cache only. The scheduler does not
// close conn.
func New(cfg Config, conn connector.Scheduler) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ns, err := cfg.Identity.Namespace()
	if err != nil {
		return nil, fmt.Errorf("%w: Identity: %w", ErrConfig, err)
	}
	pool, err := NewPool(cfg.Blocks)
	if err != nil {
		return nil, err
	}
	return &Scheduler{
		cfg:  cfg,
		id:   cfg.Identity,
		ns:   ns,
		bs:   cfg.Identity.Layout.BlockSize,
		pool: pool,
		conn: conn,
		reqs: make(map[connector.RequestID]*request),
	}, nil
}

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
	case s.blocksFor(len(req.Prompt)) > s.pool.Len():
		return fmt.Errorf("%w: Add(%q): a %d-token prompt needs %d blocks, the pool has %d", ErrTooLarge, req.ID, len(req.Prompt), s.blocksFor(len(req.Prompt)), s.pool.Len())
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
	size := len(req.Prompt) + min(req.MaxTokens, s.pool.Len()*s.bs)
	r.tokens = append(growCap(r.tokens[:0], size), req.Prompt...)
	if req.MaxTokens > 0 {
		r.blocks = growCap(r.blocks[:0], s.blocksFor(size))
	}
	r.chain = chain
	s.scratch = chain.Append(s.scratch[:0], req.Prompt...)
	r.creq = connector.Request{ID: req.ID, Prompt: len(r.tokens), Hashes: chain.Hashes(), TransferParams: slices.Clone(req.TransferParams)}
	r.m = Metrics{Added: s.step}
	s.reqs[req.ID] = r
	s.waiting = append(s.waiting, r) // the newest: last in arrival order
	return nil
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
	return new(request)
}

// forget drops a request whose blocks are back in the pool.
func (s *Scheduler) forget(r *request) {
	delete(s.reqs, r.id)
	keep := request{tokens: r.tokens[:0], blocks: r.blocks[:0]}
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
			n := min(left, budget)
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
			if err := s.conn.Scheduled(&r.creq, it.End, r.tables()...); err != nil {
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
	}
	s.inFlight = true
	s.stats.Step = s.step
	return p, nil
}

func (s *Scheduler) addItem(r *request, n int) {
	r.planned = s.step
	r.item = len(s.plan.Items)
	end := r.computed + n
	s.plan.Items = append(s.plan.Items, Item{
		ID:     r.id,
		Start:  r.computed,
		End:    end,
		Tokens: r.tokens[:end],
		Blocks: r.blocks,
		Sample: end == len(r.tokens),
	})
	s.items = append(s.items, r)
}

// grow gives running request r blocks for tokens positions. When the pool
// lacks blocks it preempts the newest running requests that are newer than
// r and not planned in this step, unless blocks that the connector keeps
// will cover the need once released; then r waits. It reports whether r
// has its blocks; r fails if it alone outgrew the pool.
func (s *Scheduler) grow(r *request, tokens int) bool {
	need := s.blocksFor(tokens) - len(r.blocks)
	if need <= 0 {
		return true
	}
	for s.pool.Available() < need {
		if s.pool.Available()+s.pendingFree >= need {
			return false
		}
		v := s.victim(r)
		if v == nil {
			if s.blocksFor(tokens) > s.pool.Len() {
				s.end(r, Failed, fmt.Errorf("%w: request %q needs %d blocks for %d tokens, the pool has %d", ErrTooLarge, r.id, s.blocksFor(tokens), tokens, s.pool.Len()))
			}
			return false
		}
		s.preempt(v)
		s.plan.Preempted = append(s.plan.Preempted, v.id)
	}
	var err error
	r.blocks, err = s.pool.Allocate(r.blocks, need)
	if err != nil {
		panic("scheduler: " + err.Error()) // Available said there were enough
	}
	return true
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

// admit admits waiting requests in arrival order while budget and blocks
// last. A lookup-pending request is skipped, never waited for.
func (s *Scheduler) admit(budget *int) {
	lookups := s.lookups()
	for i := 0; i < len(s.waiting) && *budget > 0; i++ {
		if s.cfg.MaxRunning > 0 && len(s.running)+len(s.loading) >= s.cfg.MaxRunning {
			return
		}
		r := s.waiting[i]
		if s.blocksFor(len(r.tokens)) > s.pool.Len() {
			s.end(r, Failed, fmt.Errorf("%w: request %q needs %d blocks for %d tokens, the pool has %d", ErrTooLarge, r.id, s.blocksFor(len(r.tokens)), len(r.tokens), s.pool.Len()))
			i--
			continue
		}
		// Never the last token: the engine must compute one to sample.
		limit := min((len(r.tokens)-1)/s.bs, len(r.hashes()))
		if s.mut == mutLastToken {
			limit = min(len(r.tokens)/s.bs, len(r.hashes()))
		}
		s.hits = s.hits[:0]
		if s.cfg.PrefixCaching {
			s.hits = s.pool.Lookup(s.ns, r.hashes()[:limit], s.hits)
		}
		hit := len(s.hits)
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
		if ext == 0 {
			n = min(len(r.tokens)-total, *budget)
			total += n
		}
		need := s.blocksFor(total) - hit
		if s.mut == mutOverReserve && ext == 0 {
			need = s.blocksFor(len(r.tokens)) - hit
		}
		free := s.pool.Available()
		for _, b := range s.hits {
			if s.pool.Refs(b) == 0 {
				free-- // a cached hit leaves the LRU list when referenced
			}
		}
		if need > free {
			return // first come, first served: later requests wait too
		}
		r.blocks = r.blocks[:0]
		for _, b := range s.hits {
			if err := s.pool.Ref(b); err != nil {
				panic("scheduler: " + err.Error()) // Lookup returned it
			}
			r.blocks = append(r.blocks, b)
		}
		var err error
		if r.blocks, err = s.pool.Allocate(r.blocks, need); err != nil {
			panic("scheduler: " + err.Error()) // checked above
		}
		s.waiting.remove(r)
		i--
		r.local, r.computed, r.committed = hit*s.bs, hit*s.bs, hit
		r.m.LocalTokens += hit * s.bs
		s.stats.LocalTokens += int64(hit * s.bs)
		s.stats.Admitted++
		if lookups {
			if err := s.conn.Allocated(&r.creq, ext, r.tables()...); err != nil {
				s.end(r, Failed, fmt.Errorf("%w: Allocated(%q, %d external tokens): %w", ErrConnector, r.id, ext, err))
				continue
			}
		}
		if ext > 0 {
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
	for _, b := range r.blocks {
		if s.pool.Refs(b) == 1 {
			r.exclusive++
		}
	}
	s.pendingFree += r.exclusive
}

func (s *Scheduler) releaseBlocks(r *request) {
	if err := s.pool.Release(r.blocks); err != nil {
		panic("scheduler: " + err.Error()) // the request held each block once
	}
	if s.mut == mutDoubleRelease && len(r.blocks) > 0 && s.pool.Refs(r.blocks[0]) > 0 {
		if err := s.pool.Release(r.blocks[:1]); err != nil { // the deliberate bug
			panic("scheduler: " + err.Error())
		}
	}
	r.blocks = r.blocks[:0]
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
// inconsistent, which the scheduler ignored; the step is then done.
func (s *Scheduler) Done(results []Result, outs []*connector.Output) error {
	if !s.inFlight {
		return fmt.Errorf("%w: Done called without a Step (last step %d)", ErrNoStep, s.step)
	}
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
	}
	s.inFlight = false

	// The step's compute is done: advance every planned request.
	for i := range s.plan.Items {
		it := &s.plan.Items[i]
		r := s.items[i]
		r.computed = it.End
		r.m.ComputedTokens += it.End - it.Start
		s.stats.ComputedTokens += int64(it.End - it.Start)
		s.commit(r)
	}
	var bad error
	if prog != nil {
		bad = s.progress(prog)
	}
	for i := range results {
		res := &results[i]
		r := s.results[i]
		r.tokens = append(r.tokens, res.Token)
		s.scratch = r.chain.Append(s.scratch[:0], res.Token)
		r.creq.Hashes = r.chain.Hashes()
		r.creq.Prompt = len(r.tokens)
		r.m.Generated++
		if r.m.FirstToken == 0 {
			r.m.FirstToken = s.step
		}
		if res.Finished {
			s.end(r, Finished, nil)
		}
	}
	return bad
}

// commit indexes r's full computed blocks in the prefix cache.
func (s *Scheduler) commit(r *request) {
	full := min(r.computed/s.bs, len(r.hashes()), len(r.blocks))
	if !s.cfg.PrefixCaching {
		r.committed = max(r.committed, full)
		return
	}
	for ; r.committed < full; r.committed++ {
		if _, err := s.pool.Commit(r.blocks[r.committed], s.ns, r.hashes()[r.committed]); err != nil {
			panic("scheduler: " + err.Error()) // r holds the block
		}
	}
}

// progress acts on the connector's Progress. It returns an error wrapping
// ErrConnector for entries that contradict the scheduler's state, which it
// skips.
func (s *Scheduler) progress(p *connector.Progress) error {
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
		r.held = false
		s.held--
		s.pendingFree -= r.exclusive
		r.exclusive = 0
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
// rest of its blocks (failed ones and those after) are recomputed.
func (s *Scheduler) loaded(r *request, valid int) {
	s.loading.remove(r)
	r.m.ExternalTokens += valid - r.local
	s.stats.ExternalTokens += int64(valid - r.local)
	r.computed = valid
	r.external = 0
	s.commit(r)
	r.state = Running
	s.running.insert(r)
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
		s.pool.InvalidateAll()
	}
	for len(s.running) > 0 {
		s.preempt(s.running[len(s.running)-1])
	}
	for len(s.loading) > 0 {
		s.preempt(s.loading[len(s.loading)-1])
	}
	return nil
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
		Blocks:   len(r.blocks),
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
	st.Pool = s.pool.Stats()
	return st
}
