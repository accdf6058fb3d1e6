package p2p

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"

	"github.com/kvconnect/kvconnect/connector"

	"github.com/kvconnect/kvconnect/connector/driver"
	"github.com/kvconnect/kvconnect/hashing"
)

// Planner is the scheduler half of the P2P connector. It implements
// connector.Planner, connector.Rotator and connector.StatsReporter.
//
// As a producer it offers, when a request ends, the full blocks the
// request computed: Finish keeps them and the offer's parameters wait in
// TransferParams for the engine to hand to the consumer; the blocks are
// released once every worker reports that the consumer is done with them,
// or that the offer expired (kv_connector_extra_config.keep_timeout).
//
// As a consumer it takes a request's parameters (SetParams) and matches
// the longest run of the producer's blocks whose hashes are the request's
// own, never the last prompt token; the workers read those blocks straight
// into the blocks the engine allocated, and a block that fails to arrive
// is a failed block (Progress.Failed, with the load failure policy).
type Planner struct {
	cfg     connector.Config
	opt     options
	log     *slog.Logger
	id      hashing.Identity
	ns      hashing.Namespace
	bs      int
	workers int
	board   *board

	reqs      map[connector.RequestID]*request
	transfers *driver.Tally[*transfer]
	slots     []bool // producer mailbox slots in use
	nextID    uint64
	plans     driver.PlanBuffer // Plan hands out one Metadata while the next fills
	meta      *connector.Metadata
	progress  connector.Progress
	released  []connector.RequestID
	stats     connector.Stats
	// Transfers written off by Forget: finished, failed, in the next
	// Update; the workers' reports of them, still to come from ignore[id]
	// ranks, are dropped.
	writtenOff []uint64
	offRecords map[uint64]*transfer
	ignore     map[uint64]int
	closed     bool
	onClose    func() // set by the registry: frees the engine_id
}

var (
	_ connector.Planner       = (*Planner)(nil)
	_ connector.Preempter     = (*Planner)(nil)
	_ connector.Rotator       = (*Planner)(nil)
	_ connector.StatsReporter = (*Planner)(nil)
)

// request is the scheduler half's state of one request.
type request struct {
	id connector.RequestID
	// Consumer side.
	params     *Params
	wire       []byte // params encoded, for the workers (Transfer.Params)
	paramsSeen bool   // Request.TransferParams were taken (or refused)
	from       int    // blocks the engine had locally at the last Match
	match      int    // end of the blocks the last Match offered
	load       uint64 // the planned load, 0 for none
	notice     uint64 // the planned notice, 0 for none
	notified   bool   // the producer is (or will be) told
	// Producer side.
	blocks  []connector.BlockID // the request's blocks holding computed full blocks
	hashes  []hashing.BlockHash // their hashes
	encoded []byte              // the offer's parameters, once offered
	// Both.
	inflight int  // transfers that touch its blocks
	finished bool // Finish was called while transfers ran
}

type kind uint8

const (
	kindLoad   kind = iota + 1 // consumer: read blocks from the producer
	kindNotify                 // consumer: only tell the producer it may free
	kindOffer                  // producer: keep blocks for a consumer
)

// transfer is a planned or running transfer.
type transfer struct {
	req    *request
	kind   kind
	first  int
	n      int
	slot   int    // offers
	gen    uint64 // the generation it was planned in
	failAt int    // loads: lowest failed block index over all ranks, -1 if none
	done   int    // ranks that reported it done so far
}

func newScheduler(cfg connector.Config, opt options, id hashing.Identity, ns hashing.Namespace, log *slog.Logger, b *board) *Planner {
	s := &Planner{
		cfg:       cfg,
		opt:       opt,
		log:       log,
		id:        id,
		ns:        ns,
		bs:        id.Layout.BlockSize,
		workers:   id.Layout.TPSize,
		board:     b,
		reqs:      make(map[connector.RequestID]*request),
		transfers: driver.NewTally[*transfer](id.Layout.TPSize),
		slots:     make([]bool, opt.slots),
		// Ids (transfers' and offers') start at a random point: parameters
		// that name an offer of an instance that restarted under the same
		// engine_id, whose memory may sit at the same addresses, never
		// name an offer of the new one (they meet with odds of about the
		// offers made over 2^47).
		nextID: 1<<32 + rand.Uint64N(1<<47),
	}
	b.mu.Lock()
	b.slots = opt.slots
	b.mu.Unlock()
	s.meta = s.plans.Filling()
	s.meta.Generation = id.Generation
	return s
}

// SetHandshake gives the scheduler half the memory of the worker of rank
// rank, as the worker's Handshake returned it: for a worker in another
// process. Workers from New hand it over themselves when they register.
func (s *Planner) SetHandshake(rank int, data []byte) error {
	if rank < 0 || rank >= s.workers {
		return fmt.Errorf("p2p: SetHandshake: rank %d, want [0, %d)", rank, s.workers)
	}
	r, err := decodeRank(data)
	if err != nil {
		return fmt.Errorf("p2p: SetHandshake(rank %d): %w", rank, err)
	}
	if r.Slots != len(s.slots) {
		return fmt.Errorf("%w: p2p: SetHandshake(rank %d): the worker has %d mailbox slots, the scheduler half %d: kv_connector_extra_config mailbox_slots must be the same in both halves", connector.ErrConfig, rank, r.Slots, len(s.slots))
	}
	s.board.setRank(rank, r)
	return nil
}

// SetParams gives a consumer the transfer parameters of request id, which
// the producer's TransferParams returned, before the request's first
// Match. Parameters of another namespace are refused with an error
// wrapping [ErrIdentity]; malformed ones or ones that do not fit this
// connector (block size, number of ranks) with [ErrParams]. A refused
// request simply matches nothing.
func (s *Planner) SetParams(id connector.RequestID, data []byte) error {
	if s.closed {
		return connector.ErrClosed
	}
	if !s.cfg.Role.CanLoad() {
		return fmt.Errorf("%w: SetParams(%q): role %s does not load", connector.ErrConfig, id, s.cfg.Role)
	}
	p, err := s.checkParams(data)
	if err != nil {
		// Parameters come from outside (a request body): each refusal
		// is counted and logged.
		s.stats.Refused++
		err = fmt.Errorf("p2p: SetParams(%q): %w", id, err)
		s.log.Warn("p2p: transfer parameters refused", "request", id, "err", err)
		return err
	}
	q := s.reqs[id]
	if q == nil {
		q = &request{id: id}
		s.reqs[id] = q
	}
	if q.load != 0 || q.finished {
		return fmt.Errorf("p2p: SetParams(%q): the request is already loading or finished", id)
	}
	q.params = &p
	q.wire = slices.Clone(data)
	q.notified = false
	return nil
}

// checkParams decodes parameters and checks they fit this consumer.
func (s *Planner) checkParams(data []byte) (Params, error) {
	p, err := DecodeParams(data)
	if err != nil {
		return p, err
	}
	if want := namespaceOf(s.ns); p.Namespace != want {
		return p, fmt.Errorf("%w: producer namespace %q, consumer %q", ErrIdentity, p.Namespace, want)
	}
	if p.BlockSize != s.bs {
		return p, fmt.Errorf("%w: block_size = %d, the consumer's is %d", ErrParams, p.BlockSize, s.bs)
	}
	if len(p.Ranks) != s.workers {
		return p, fmt.Errorf("%w: %d ranks, the consumer has %d", ErrParams, len(p.Ranks), s.workers)
	}
	if s.opt.verify {
		for i, r := range p.Ranks {
			if r.Digests == 0 {
				return p, fmt.Errorf("%w: ranks[%d].digests is 0: the producer publishes no digests, and this consumer verifies every block (verify \"checksum\"); a producer with KV in device memory, or verify \"none\", needs consumers with verify \"none\"", ErrParams, i)
			}
		}
	}
	return p, nil
}

// TransferParams returns the encoded transfer parameters of a request that
// Finish kept for an offer (see [EncodeParams]), until the request is
// released: what the engine returns with the request, for the consumer's
// SetParams.
func (s *Planner) TransferParams(id connector.RequestID) ([]byte, error) {
	q := s.reqs[id]
	if q == nil || q.encoded == nil {
		return nil, fmt.Errorf("%w: TransferParams(%q): no offer (not a producer, no full block computed, workers not registered, or already released)", connector.ErrUnknownRequest, id)
	}
	return slices.Clone(q.encoded), nil
}

// Match implements connector.Planner: without parameters, nothing;
// with them, the run of the producer's blocks that are the request's own
// blocks, from the engine's local hit on, never the last prompt token.
func (s *Planner) Match(r *connector.Request, computed int) (connector.Match, error) {
	if s.closed {
		return connector.Match{}, connector.ErrClosed
	}
	if computed < 0 || computed%s.bs != 0 {
		return connector.Match{}, fmt.Errorf("p2p: Match(%q): computed = %d, want a multiple of the block size %d", r.ID, computed, s.bs)
	}
	q := s.reqs[r.ID]
	if q == nil {
		q = &request{id: r.ID}
		s.reqs[r.ID] = q
	} else if q.finished {
		return connector.Match{}, fmt.Errorf("p2p: Match(%q): request finished and not yet released", r.ID)
	}
	q.from, q.match = computed/s.bs, 0
	if q.params == nil && !q.paramsSeen && len(r.TransferParams) > 0 {
		// Parameters that came with the request: take them once. Refused
		// ones (another identity, another shape) match nothing, and the
		// engine computes the prompt itself.
		q.paramsSeen = true
		if err := s.SetParams(r.ID, r.TransferParams); err != nil {
			// SetParams counted the refusal and logged why.
			s.log.Debug("p2p: the request matches nothing: its transfer parameters were refused", "request", r.ID)
		}
	}
	p := q.params
	if !s.cfg.Role.CanLoad() || p == nil || p.Namespace != namespaceOf(s.ns) || q.load != 0 {
		return connector.Match{}, nil
	}
	n := 0
	for n < len(p.Hashes) && n < len(r.Hashes) && p.Hashes[n] == r.Hashes[n] {
		n++
	}
	limit := 0
	if r.Prompt > 0 {
		limit = (r.Prompt - 1) / s.bs
	}
	limit = min(limit, n)
	if q.from >= limit {
		return connector.Match{}, nil
	}
	q.match = limit
	return connector.Match{Tokens: (limit - q.from) * s.bs}, nil
}

// Allocated implements connector.Planner: it plans the load of the
// matched blocks into blocks, or, when the engine loads none, a notice to
// the producer that it may free them.
func (s *Planner) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
	if err := driver.CheckTables("p2p: Allocated", r.ID, tables, 1, false); err != nil {
		return err
	}
	blocks := tables[0]
	if s.closed {
		return connector.ErrClosed
	}
	q := s.reqs[r.ID]
	if q == nil {
		return fmt.Errorf("%w: Allocated(%q) before Match", connector.ErrUnknownRequest, r.ID)
	}
	if external == 0 {
		s.notify(q)
		return nil
	}
	if external < 0 || external%s.bs != 0 {
		return fmt.Errorf("p2p: Allocated(%q): external = %d, want a multiple of the block size %d", r.ID, external, s.bs)
	}
	n := external / s.bs
	if q.params == nil || q.from+n > q.match {
		return fmt.Errorf("p2p: Allocated(%q): external = %d tokens exceeds the last match", r.ID, external)
	}
	if q.from+n > len(blocks) || q.from+n > len(r.Hashes) {
		return fmt.Errorf("%w: Allocated(%q): %d blocks and %d hashes do not cover %d tokens", connector.ErrInvalidBlock, r.ID, len(blocks), len(r.Hashes), (q.from+n)*s.bs)
	}
	if q.load != 0 {
		return fmt.Errorf("p2p: Allocated(%q): a load is already planned", r.ID)
	}
	s.nextID++
	t := connector.Transfer{
		ID:     s.nextID,
		Req:    r.ID,
		First:  q.from,
		Blocks: slices.Clone(blocks[q.from : q.from+n]),
		Hashes: slices.Clone(r.Hashes[q.from : q.from+n]),
		Params: q.wire,
	}
	s.meta.Loads = append(s.meta.Loads, t)
	s.track(q, t.ID, kindLoad, q.from, n, 0)
	q.load = t.ID
	q.notified = true
	s.stats.HitBlocks += int64(n)
	s.stats.HitTokens += int64(external)
	return nil
}

// notify plans a notice to the producer of q's parameters that it may
// free its blocks, unless one is planned or a load will tell it.
func (s *Planner) notify(q *request) {
	if q.params == nil || q.notified || q.load != 0 {
		return
	}
	q.notified = true
	s.nextID++
	s.meta.Loads = append(s.meta.Loads, connector.Transfer{ID: s.nextID, Req: q.id, Params: q.wire})
	s.track(q, s.nextID, kindNotify, 0, 0, 0)
	q.notice = s.nextID
}

// track records a planned transfer.
func (s *Planner) track(q *request, id uint64, k kind, first, n, slot int) {
	s.transfers.Add(id, n, &transfer{req: q, kind: k, first: first, n: n, slot: slot, gen: s.meta.Generation, failAt: -1})
	if k != kindNotify {
		q.inflight++
	}
}

// Scheduled implements connector.Planner. A producer records the
// request's computed full blocks, to offer them when it ends.
func (s *Planner) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
	if err := driver.CheckTables("p2p: Scheduled", r.ID, tables, 1, false); err != nil {
		return err
	}
	blocks := tables[0]
	if s.closed {
		return connector.ErrClosed
	}
	q := s.reqs[r.ID]
	if q == nil {
		q = &request{id: r.ID}
		s.reqs[r.ID] = q
	}
	if q.finished {
		return fmt.Errorf("p2p: Scheduled(%q): request finished", r.ID)
	}
	if !s.cfg.Role.CanSave() {
		return nil
	}
	full := min(computed/s.bs, len(r.Hashes))
	if full < 0 || full > len(blocks) {
		return fmt.Errorf("%w: Scheduled(%q): %d blocks do not hold %d computed tokens", connector.ErrInvalidBlock, r.ID, len(blocks), computed)
	}
	q.blocks = append(q.blocks[:0], blocks[:full]...)
	q.hashes = append(q.hashes[:0], r.Hashes[:full]...)
	return nil
}

// Plan implements connector.Planner.
func (s *Planner) Plan() *connector.Metadata {
	s.meta.Step++
	m := s.plans.HandOut()
	s.meta = s.plans.Filling()
	return m
}

// Update implements connector.Planner.
func (s *Planner) Update(outs []*connector.Output) (*connector.Progress, error) {
	if s.closed {
		return nil, connector.ErrClosed
	}
	s.progress.Loaded = s.progress.Loaded[:0]
	s.progress.Failed = s.progress.Failed[:0]
	s.progress.Released = s.progress.Released[:0]
	// A bad Output is an error that changes nothing.
	failed := func(x *transfer, f connector.Failure) {
		if x.kind == kindLoad && (x.failAt < 0 || f.Index < x.failAt) {
			x.failAt = f.Index
		}
	}
	outs, ignored := s.dropIgnored(outs)
	if err := s.transfers.Apply("p2p: Update", outs, failed, s.finishTransfer); err != nil {
		return nil, err
	}
	for _, o := range outs {
		for _, id := range o.Done {
			if x, ok := s.transfers.Get(id); ok {
				x.done++ // some ranks are still to report it
			}
		}
	}
	for _, id := range ignored {
		if s.ignore[id]--; s.ignore[id] <= 0 {
			delete(s.ignore, id)
		}
	}
	for _, id := range s.writtenOff {
		s.finishTransfer(id, s.offRecords[id])
		delete(s.offRecords, id)
	}
	s.writtenOff = s.writtenOff[:0]
	s.progress.Released = append(s.progress.Released, s.released...)
	s.released = s.released[:0]
	return &s.progress, nil
}

// finishTransfer acts on a transfer every worker reported.
func (s *Planner) finishTransfer(id uint64, x *transfer) {
	q := x.req
	switch x.kind {
	case kindNotify:
		q.notice = 0
		return
	case kindLoad:
		q.load = 0
		if x.gen != s.meta.Generation {
			// Read under weights that have since been rotated out.
			x.failAt = 0
		}
		if x.failAt >= 0 {
			s.stats.LoadFailures += int64(x.n - x.failAt)
			s.progress.Failed = append(s.progress.Failed, connector.LoadFailure{
				Req:   q.id,
				Valid: (x.first + x.failAt) * s.bs,
				Fail:  s.cfg.LoadFailurePolicy == connector.PolicyFail,
			})
		} else {
			s.progress.Loaded = append(s.progress.Loaded, q.id)
		}
	case kindOffer:
		s.slots[x.slot] = false
		q.encoded = nil
	}
	q.inflight--
	if q.finished && q.inflight == 0 {
		delete(s.reqs, q.id)
		s.released = append(s.released, q.id)
	}
}

// Forget writes off the producer instance whose engine id
// (kv_transfer_config engine_id, which its parameters carry as
// Params.Engine) is engineID: for a producer that restarted or is gone
// for good, whose transfers would otherwise never be reported. In the
// next Update every load from it that has not been reported is reported
// failed from its first block (Progress.Failed, with the load failure
// policy, counted in Stats.LoadFailures), and a request that Finish kept
// for such a load is released (Progress.Released); notices to it are
// dropped, and parameters from it that no load used yet match nothing
// from then on. The workers' later reports of those transfers are
// ignored. Forget does not stop the workers' transfers: it is for a peer
// that is gone (whose memory no longer exists, so nothing of it can
// arrive late), not a way to cancel loads from a live one. A read of such
// a load still under way in a worker may yet write the blocks that the
// engine, told the load failed, now recomputes: call Forget only once the
// peer's process is known dead (its reads then fail or end at once, as
// rdma/shm's and Mooncake's do), or keep those blocks out of use until
// the worker's transfers end (its Close returning nil says they have).
//
// Forget of an engine id nothing waits on does nothing. Only parameters
// that carry an engine id can be written off: an empty engineID is an
// error. A producer's own offers are not tied to a consumer: they end
// when their consumer is done or after keep_timeout. Forget does not
// block.
func (s *Planner) Forget(engineID string) error {
	if s.closed {
		return connector.ErrClosed
	}
	if engineID == "" {
		return fmt.Errorf("%w: p2p: Forget(%q): engine id is empty: a producer's parameters name it in Params.Engine (its kv_transfer_config engine_id)", connector.ErrConfig, engineID)
	}
	for _, q := range s.reqs {
		if q.params == nil || q.params.Engine != engineID {
			continue
		}
		for _, id := range []uint64{q.load, q.notice} {
			if id != 0 {
				s.writeOff(id)
			}
		}
		q.params = nil
		q.notified = true
	}
	return nil
}

// writeOff stops tracking transfer id, to finish it, failed, in the next
// Update, and drops the workers' reports of it from then on.
func (s *Planner) writeOff(id uint64) {
	x, ok := s.transfers.Get(id)
	if !ok {
		return
	}
	s.transfers.Drop(id)
	planned := false
	s.meta.Loads = slices.DeleteFunc(s.meta.Loads, func(t connector.Transfer) bool {
		planned = planned || t.ID == id
		return t.ID == id
	})
	if !planned {
		// In a Metadata the workers may have started: their reports
		// are dropped.
		if s.ignore == nil {
			s.ignore = make(map[uint64]int)
		}
		s.ignore[id] = s.workers - x.done
	}
	if x.kind == kindLoad {
		x.failAt = 0
	}
	if s.offRecords == nil {
		s.offRecords = make(map[uint64]*transfer)
	}
	s.offRecords[id] = x
	s.writtenOff = append(s.writtenOff, id)
}

// dropIgnored returns outs without the reports of written-off transfers,
// and the ids of the Done reports it dropped (one per rank).
func (s *Planner) dropIgnored(outs []*connector.Output) ([]*connector.Output, []uint64) {
	if len(s.ignore) == 0 {
		return outs, nil
	}
	var ignored []uint64
	kept := make([]*connector.Output, len(outs))
	for i, o := range outs {
		if o == nil {
			kept[i] = o
			continue
		}
		c := *o
		c.Done, c.Failed = nil, nil
		for _, id := range o.Done {
			if _, ok := s.ignore[id]; ok {
				ignored = append(ignored, id)
				continue
			}
			c.Done = append(c.Done, id)
		}
		for _, f := range o.Failed {
			if _, ok := s.ignore[f.Transfer]; !ok {
				c.Failed = append(c.Failed, f)
			}
		}
		kept[i] = &c
	}
	return kept, ignored
}

// Finish implements connector.Planner. A producer offers the request's
// computed full blocks (keep is then true until the consumer is done or
// the offer expires); a consumer that loaded nothing tells the producer
// it may free its blocks.
func (s *Planner) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	if err := driver.CheckTables("p2p: Finish", r.ID, tables, 1, true); err != nil {
		return false, err
	}
	blocks := driver.Table(tables, 0)
	return s.end(r, blocks, true)
}

// Preempt implements connector.Preempter: like Finish, but a preempted
// request's blocks are not offered, since no consumer will continue it.
func (s *Planner) Preempt(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	if err := driver.CheckTables("p2p: Preempt", r.ID, tables, 1, true); err != nil {
		return false, err
	}
	blocks := driver.Table(tables, 0)
	return s.end(r, blocks, false)
}

// end ends r; offer says whether a producer offers its blocks.
func (s *Planner) end(r *connector.Request, blocks []connector.BlockID, offer bool) (bool, error) {
	if s.closed {
		return false, connector.ErrClosed
	}
	q := s.reqs[r.ID]
	if q == nil {
		return false, nil
	}
	if q.finished {
		return false, fmt.Errorf("p2p: Finish(%q) called twice", r.ID)
	}
	s.notify(q)
	if offer && s.cfg.Role.CanSave() && len(q.blocks) > 0 {
		if err := s.offer(q, blocks); err != nil {
			s.log.Warn("p2p: no offer", "request", r.ID, "err", err)
		}
	}
	if q.inflight == 0 {
		delete(s.reqs, r.ID)
		return false, nil
	}
	q.finished = true
	return true, nil
}

// offer plans the offer of q's computed blocks.
func (s *Planner) offer(q *request, blocks []connector.BlockID) error {
	n := len(q.blocks)
	if len(blocks) < n {
		return fmt.Errorf("%w: Finish(%q): %d blocks, %d were computed", connector.ErrInvalidBlock, q.id, len(blocks), n)
	}
	ranks, ok := s.board.handshake()
	if !ok {
		return ErrNoHandshake
	}
	// The offer's ID names its mailbox slot (ID mod slots): skip IDs whose
	// slot is in use.
	slot := -1
	for range len(s.slots) {
		s.nextID++
		if i := int(s.nextID % uint64(len(s.slots))); !s.slots[i] {
			slot = i
			break
		}
	}
	if slot < 0 {
		s.stats.SaveSkipped += int64(n)
		return fmt.Errorf("all %d mailbox slots hold offers (kv_connector_extra_config.mailbox_slots)", len(s.slots))
	}
	id := s.nextID
	_, ticket := newTicket()
	p := Params{
		Version:   paramsVersion,
		Namespace: namespaceOf(s.ns),
		Engine:    s.cfg.EngineID,
		Offer:     id,
		Slot:      slot,
		Ticket:    ticket,
		BlockSize: s.bs,
		Blocks:    slices.Clone(blocks[:n]),
		Hashes:    slices.Clone(q.hashes),
		Ranks:     ranks,
	}
	enc, err := EncodeParams(p)
	if err != nil {
		return err
	}
	s.slots[slot] = true
	q.encoded = enc
	// The workers take the offer's ticket and seal from its parameters.
	t := connector.Transfer{ID: id, Req: q.id, Blocks: p.Blocks, Hashes: p.Hashes, Params: enc}
	s.meta.Saves = append(s.meta.Saves, t)
	s.track(q, id, kindOffer, 0, n, slot)
	// The workers of this process arm it now: the parameters may reach a
	// consumer before this producer runs another step.
	s.board.handOn(t)
	s.stats.Saves += int64(n)
	return nil
}

// Rotate implements connector.Rotator: parameters of an older generation
// are refused from then on, and offers carry the new namespace. Offers
// already made stand until they are consumed or expire. Generations only
// grow: gen must be newer than the current one, else Rotate returns an
// error wrapping [connector.ErrGeneration] and changes nothing.
func (s *Planner) Rotate(gen uint64) error {
	if s.closed {
		return connector.ErrClosed
	}
	if cur := s.meta.Generation; gen <= cur {
		return fmt.Errorf("p2p: rotate to generation %d, current generation %d: %w", gen, cur, connector.ErrGeneration)
	}
	id := s.id
	id.Generation = gen
	ns, err := id.Namespace()
	if err != nil {
		return fmt.Errorf("p2p: rotate to generation %d: %w", gen, err)
	}
	s.id, s.ns = id, ns
	s.meta.Generation = gen
	// Blocks computed under the old weights are not offered.
	for _, q := range s.reqs {
		q.blocks, q.hashes = q.blocks[:0], q.hashes[:0]
	}
	return nil
}

// Stats implements connector.StatsReporter.
func (s *Planner) Stats() connector.Stats { return s.stats }

// Close implements connector.Planner. The scheduler half owns no
// goroutines.
func (s *Planner) Close() error {
	if !s.closed && s.onClose != nil {
		s.onClose()
	}
	s.closed = true
	return nil
}
