package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// Worker is the worker half of the P2P connector, for one tensor-parallel
// rank and its transfer engine. It implements connector.Worker and
// connector.StatsReporter.
//
// Register registers the KV memory with the engine, and a mailbox: one
// 16-byte slot per offer the producer may hold (see the package
// documentation, "The mailbox"). A producer worker arms each offer its
// scheduler half hands on in Finish, or that the Metadata's Saves carry,
// and reports the offer done once the consumer wrote its done word, or
// once keep_timeout passed; either way it ends the offer first, so that a
// consumer still reading learns the blocks are no longer its. A consumer
// worker runs each load of the Metadata's Loads on a goroutine: it reads
// the producer's blocks into its own with one batch, reads the offer word
// back to check that the offer still stood while it read, and writes the
// done word.
//
// Reads are verified end to end when the KV memory is host memory: a
// producer worker writes the CRC-32 (IEEE) of each block of an offer into
// a digest table beside its mailbox before it arms the offer; a consumer
// worker reads the digests of a load's blocks with the blocks, and once
// the slot check passed, checks each block it read. A block that does not
// match fails its load from that block on, is counted (Stats.Corrupt),
// and is never reported loaded. kv_connector_extra_config "verify": "none"
// turns verification off: a producer then publishes no digests (its
// consumers read without checking), a consumer checks none.
//
// A load is reported, loaded or failed, only once every transfer it made
// is settled (final, in the sense of [rdma.Status.Final]: nothing moves
// its bytes any more), so that the engine never reuses a block a late
// transfer may still write. While the worker is open a transfer is
// waited for without a bound, also when its Submit failed after queuing
// requests, and is logged every 10 s meanwhile; Close waits for it for up
// to close_timeout. A transfer that did not settle by then, or whose end
// the engine cannot tell (its Wait fails), leaves its load unreported for
// good: its blocks stay out of use, and Close returns an error wrapping
// [rdma.ErrBusy] and frees no memory such a transfer may touch.
type Worker struct {
	cfg   connector.Config
	opt   options
	rank  int
	eng   rdma.Engine
	log   *slog.Logger
	board *board
	now   func() time.Time

	kv      connector.KVCache
	self    Rank
	owned   bool            // eng was opened by the worker (kv_connector_extra_config transfer): Close closes it
	mailbox hostMem         // producer slots
	digests hostMem         // producer: the CRC-32 of each block, by block id; nil for device memory
	scratch hostMem         // consumer cells: 16 bytes per running load
	sums    hostMem         // consumer: per cell, the producer's digests of a load's blocks; nil unverified
	cells   chan int        // free cells: bounds the loads running at once
	regs    []rdma.Region   // registered with the engine
	offers  map[uint64]held // producer: armed offers
	handed  map[uint64]bool // producer: offers handed on by the scheduler half, to skip in Metadata
	gen     uint64          // the newest generation seen: the identity's, then Metadata's
	out     connector.Output

	ctx    context.Context
	cancel context.CancelFunc
	// retire ends close_timeout after Close began: transfers not settled
	// by then are given up on, their memory retired.
	retire    context.Context
	retireNow context.CancelFunc
	wg        sync.WaitGroup
	segs      struct {
		sync.Mutex
		m map[string]*opening // by segment name
	}
	mu struct {
		sync.Mutex
		done      []loadResult
		stats     connector.Stats
		unsettled int                 // loads left unreported: transfers whose end the engine could not tell
		arming    map[uint64]struct{} // producer: offers whose digests are being computed, not yet armed
	}
	// life serializes the engine-facing calls with Close, which may come
	// from another goroutine.
	life   sync.Mutex
	closed bool
	freed  bool // Close unregistered the memory: no transfer could write it any more

	// hooks let this package's tests stop the worker at fixed points;
	// nil outside tests.
	hooks struct {
		beforeArm func() // a Start's offers are about to be digested and armed
		afterArm  func() // they are armed, or were withdrawn
		openWait  func() // a load waits for another load's Open of its segment
	}
}

var (
	_ connector.Worker        = (*Worker)(nil)
	_ connector.StatsReporter = (*Worker)(nil)
)

// held is an armed offer.
type held struct {
	slot     int
	ticket   uint64 // the done word that ends it
	seal     seal   // written into its slot before it is armed
	deadline time.Time
}

// holding returns the offer of save t, from the parameters it carries
// (Transfer.Params, as the scheduler half encoded them): its slot, its
// ticket and its seal.
func (w *Worker) holding(t *connector.Transfer) (held, error) {
	if len(t.Params) == 0 {
		return held{}, fmt.Errorf("%w: offer %d of request %q carries no transfer parameters (Transfer.Params): it was not made by this connector's scheduler half", connector.ErrBadMetadata, t.ID, t.Req)
	}
	p, err := DecodeParams(t.Params)
	if err != nil {
		return held{}, fmt.Errorf("%w: offer %d of request %q: %w", connector.ErrBadMetadata, t.ID, t.Req, err)
	}
	if p.Offer != t.ID || len(p.Blocks) != len(t.Blocks) {
		return held{}, fmt.Errorf("%w: offer %d of request %q carries the parameters of offer %d (%d blocks, the offer %d)", connector.ErrBadMetadata, t.ID, t.Req, p.Offer, len(p.Blocks), len(t.Blocks))
	}
	for i, b := range p.Blocks {
		if t.Blocks[i] != b {
			return held{}, fmt.Errorf("%w: offer %d of request %q: blocks[%d] = %d, its parameters say %d", connector.ErrBadMetadata, t.ID, t.Req, i, t.Blocks[i], b)
		}
	}
	ticket, _ := parseTicket(p.Ticket) // valid: DecodeParams checked it
	return held{slot: int(t.ID % uint64(w.opt.slots)), ticket: ticket, seal: offerSeal(&p)}, nil
}

// loadResult is a finished load.
type loadResult struct {
	id       uint64
	failures []connector.Failure
}

// maxLoads is the number of loads a worker runs at once.
const maxLoads = 16

func newWorker(cfg connector.Config, opt options, rank int, eng rdma.Engine, gen uint64, log *slog.Logger, b *board) *Worker {
	w := &Worker{cfg: cfg, opt: opt, rank: rank, eng: eng, gen: gen, log: log, board: b, now: time.Now, offers: make(map[uint64]held), handed: make(map[uint64]bool)}
	w.out.Rank = rank
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.retire, w.retireNow = context.WithCancel(context.Background())
	w.segs.m = make(map[string]*opening)
	w.mu.arming = make(map[uint64]struct{})
	return w
}

// Register implements connector.Worker: it registers kv's regions, a
// mailbox and a scratch area with the engine, and hands the scheduler half
// this rank's memory.
func (w *Worker) Register(kv connector.KVCache) error {
	w.life.Lock()
	defer w.life.Unlock()
	if w.closed {
		return connector.ErrClosed
	}
	if w.regs != nil {
		return fmt.Errorf("p2p: Register called twice")
	}
	// Its size first, without overflow: KVCache.Validate's int64
	// product can wrap to the size of the regions.
	if _, err := layoutBytes(kvCacheFields, kv.Layers, kv.KV, kv.Blocks, kv.BlockBytes); err != nil {
		return fmt.Errorf("p2p: Register: %w", err)
	}
	if len(kv.Groups) != 0 {
		return fmt.Errorf("%w: p2p: Register: KVCache.Groups has %d groups: this connector moves the one group of a layout without Layout.Groups", connector.ErrConfig, len(kv.Groups))
	}
	if err := kv.Validate(); err != nil {
		return err
	}
	var err error
	defer func() {
		if err != nil {
			w.unregister()
		}
	}()
	for _, r := range kv.Regions {
		if err = w.eng.Register(r); err != nil {
			return fmt.Errorf("p2p: register KV memory: %w", err)
		}
		w.regs = append(w.regs, r)
	}
	if w.mailbox, err = w.alloc(headerBytes + w.opt.slots*slotBytes); err != nil {
		return fmt.Errorf("p2p: mailbox: %w", err)
	}
	if err = w.eng.Register(w.mailbox.Region()); err != nil {
		return fmt.Errorf("p2p: register mailbox: %w", err)
	}
	w.regs = append(w.regs, w.mailbox.Region())
	if w.scratch, err = w.alloc(maxLoads * cellBytes); err != nil {
		return fmt.Errorf("p2p: scratch: %w", err)
	}
	if err = w.eng.Register(w.scratch.Region()); err != nil {
		return fmt.Errorf("p2p: register scratch: %w", err)
	}
	w.regs = append(w.regs, w.scratch.Region())
	// Digests need the blocks' bytes: host memory only.
	host := kv.Regions[0].Loc.IsHost()
	if host && w.cfg.Role.CanSave() && w.opt.verify {
		if w.digests, err = w.alloc(kv.Blocks * 4); err != nil {
			return fmt.Errorf("p2p: digest table: %w", err)
		}
		if err = w.eng.Register(w.digests.Region()); err != nil {
			return fmt.Errorf("p2p: register digest table: %w", err)
		}
		w.regs = append(w.regs, w.digests.Region())
	}
	if host && w.cfg.Role.CanLoad() && w.opt.verify {
		if w.sums, err = w.alloc(maxLoads * kv.Blocks * 4); err != nil {
			return fmt.Errorf("p2p: digest cells: %w", err)
		}
		if err = w.eng.Register(w.sums.Region()); err != nil {
			return fmt.Errorf("p2p: register digest cells: %w", err)
		}
		w.regs = append(w.regs, w.sums.Region())
	}
	w.cells = make(chan int, maxLoads)
	for i := range maxLoads {
		w.cells <- i
	}
	w.kv = kv
	w.self = Rank{
		Segment: w.eng.Segment(), Mailbox: uint64(w.mailbox.Region().Addr), Slots: w.opt.slots, Nonce: newNonce(),
		Layers: kv.Layers, Blocks: kv.Blocks, KV: kv.KV, BlockBytes: kv.BlockBytes, Order: kv.Order.String(),
	}
	for _, r := range kv.Regions {
		w.self.Regions = append(w.self.Regions, uint64(r.Addr))
	}
	if w.digests != nil {
		w.self.Digests = uint64(w.digests.Region().Addr)
	}
	// The header that tells a consumer this memory is this worker's
	// mailbox: written before any parameters name it.
	hdr := w.mailbox.Bytes()[:headerBytes]
	copy(hdr, mailboxMagic[:])
	ms := mailboxSeal(&w.self)
	copy(hdr[8:], ms[:])
	if n := w.board.slotCount(); n != 0 && n != w.opt.slots {
		return fmt.Errorf("%w: p2p: Register: the worker has %d mailbox slots, its scheduler half %d: kv_connector_extra_config mailbox_slots must be the same in both halves", connector.ErrConfig, w.opt.slots, n)
	}
	w.board.join(w.rank, w, w.self)
	return nil
}

// unregister withdraws everything Register registered and frees the
// mailbox and scratch memory. An engine closed first has withdrawn it
// already.
func (w *Worker) unregister() error {
	var errs []error
	for _, r := range w.regs {
		if err := w.eng.Unregister(r); err != nil && !errors.Is(err, rdma.ErrClosed) {
			errs = append(errs, err)
		}
	}
	w.regs = nil
	for _, m := range []hostMem{w.mailbox, w.scratch, w.digests, w.sums} {
		if m != nil {
			if err := m.Free(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	w.mailbox, w.scratch, w.digests, w.sums = nil, nil, nil, nil
	return errors.Join(errs...)
}

// Handshake returns this rank's memory (segment, region addresses, layout,
// mailbox) for a scheduler half in another process: its SetHandshake.
func (w *Worker) Handshake() ([]byte, error) {
	w.life.Lock()
	defer w.life.Unlock()
	if w.regs == nil {
		return nil, connector.ErrNotRegistered
	}
	return encodeRank(w.self)
}

// slot returns the offer word of mailbox slot i, which only this worker
// writes.
func (w *Worker) slot(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&w.mailbox.Bytes()[headerBytes+i*slotBytes]))
}

// doneWord returns the done word of mailbox slot i, which only consumers
// write.
func (w *Worker) doneWord(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&w.mailbox.Bytes()[headerBytes+i*slotBytes+8]))
}

// putSeal writes an offer's seal into slot i, before the offer is armed.
func (w *Worker) putSeal(i int, sl seal) {
	copy(w.mailbox.Bytes()[headerBytes+i*slotBytes+sealAt:], sl[:])
}

// cellBytes is the scratch of one running load: the producer's mailbox
// header or slot is read into its first 64 bytes, the done notice written
// from the 8 after.
const cellBytes = 128

// Start implements connector.Worker: it arms the offers of m's Saves and
// starts its Loads. With a digest table the offers are armed by a
// goroutine, once it has computed their blocks' digests. Metadata of a generation older than one the worker has
// seen (its identity's, or an earlier Metadata's) is an error wrapping
// [connector.ErrBadMetadata] and [connector.ErrGeneration], and starts
// nothing.
func (w *Worker) Start(ctx context.Context, m *connector.Metadata) error {
	w.life.Lock()
	defer w.life.Unlock()
	if w.closed {
		return connector.ErrClosed
	}
	if w.regs == nil {
		return connector.ErrNotRegistered
	}
	if m.Generation < w.gen {
		return fmt.Errorf("%w: step %d: Metadata of generation %d, after generation %d: %w", connector.ErrBadMetadata, m.Step, m.Generation, w.gen, connector.ErrGeneration)
	}
	plans := make([]*loadPlan, len(m.Loads))
	for i := range m.Loads {
		t := &m.Loads[i]
		plan, err := w.plan(t)
		if err != nil {
			return err
		}
		plans[i] = plan
		if err := w.checkBlocks(t); err != nil {
			return err
		}
		if len(t.Blocks) > w.kv.Blocks {
			return fmt.Errorf("%w: load %d has %d blocks, the KV memory %d", connector.ErrBadMetadata, t.ID, len(t.Blocks), w.kv.Blocks)
		}
	}
	holds := make([]held, len(m.Saves))
	for i := range m.Saves {
		if err := w.checkBlocks(&m.Saves[i]); err != nil {
			return err
		}
		if w.handed[m.Saves[i].ID] {
			continue
		}
		h, err := w.holding(&m.Saves[i])
		if err != nil {
			return err
		}
		holds[i] = h
	}
	w.gen = m.Generation
	var saves []connector.Transfer
	var hs []held
	for i, t := range m.Saves {
		if w.handed[t.ID] {
			// Armed when the scheduler half handed it on.
			delete(w.handed, t.ID)
			continue
		}
		saves, hs = append(saves, t), append(hs, holds[i])
	}
	w.offer(saves, hs)
	for i, t := range m.Loads {
		blocks := append([]connector.BlockID(nil), t.Blocks...)
		plan := plans[i]
		w.wg.Go(func() { w.load(t.ID, blocks, plan) })
	}
	return nil
}

// offer arms the offers saves, hs[i] the offer of saves[i], under
// w.life: at once without a digest table, else on a goroutine once their
// digests are in the table; either way the seal goes into the slot before
// the offer is armed. Their keep_timeout starts now.
func (w *Worker) offer(saves []connector.Transfer, hs []held) {
	deadline := w.now().Add(w.opt.keepTimeout)
	var jobs []armJob
	for i, t := range saves {
		h := hs[i]
		h.deadline = deadline
		w.offers[t.ID] = h
		if w.digests == nil {
			w.putSeal(h.slot, h.seal)
			w.slot(h.slot).Store(armed(t.ID))
			continue
		}
		jobs = append(jobs, armJob{id: t.ID, slot: h.slot, seal: h.seal, blocks: append([]connector.BlockID(nil), t.Blocks...)})
	}
	if len(jobs) > 0 {
		// Digesting an offer reads all its bytes: not on the step's path.
		w.mu.Lock()
		for _, j := range jobs {
			w.mu.arming[j.id] = struct{}{}
		}
		w.mu.Unlock()
		w.wg.Go(func() { w.arm(jobs) })
	}
}

// handOn arms offer t, which the scheduler half of this process made in
// Finish, without waiting for the Metadata that carries it (Start skips
// it there): an offer stands from the moment its parameters exist, also
// on a producer that runs no further step. An offer this worker cannot
// take (closed, not registered, a block out of range) is left to Start,
// which reports what is wrong.
func (w *Worker) handOn(t connector.Transfer) {
	w.life.Lock()
	defer w.life.Unlock()
	if w.closed || w.regs == nil || w.checkBlocks(&t) != nil {
		return
	}
	if _, ok := w.offers[t.ID]; ok {
		return
	}
	h, err := w.holding(&t)
	if err != nil {
		return
	}
	w.handed[t.ID] = true
	w.offer([]connector.Transfer{t}, []held{h})
}

// plan returns the producer's side of load t, from the transfer
// parameters it carries (Transfer.Params, as the scheduler half took them
// in SetParams): the consumer's worker needs nothing else.
func (w *Worker) plan(t *connector.Transfer) (*loadPlan, error) {
	if len(t.Params) == 0 {
		return nil, fmt.Errorf("%w: load %d of request %q carries no transfer parameters (Transfer.Params): it was not planned by this connector's scheduler half", connector.ErrBadMetadata, t.ID, t.Req)
	}
	p, err := DecodeParams(t.Params)
	if err != nil {
		return nil, fmt.Errorf("%w: load %d of request %q: %w", connector.ErrBadMetadata, t.ID, t.Req, err)
	}
	if len(p.Ranks) <= w.rank {
		return nil, fmt.Errorf("%w: load %d of request %q: the producer has %d ranks, this worker is rank %d", connector.ErrBadMetadata, t.ID, t.Req, len(p.Ranks), w.rank)
	}
	if len(t.Blocks) == 0 {
		return &loadPlan{params: p, notify: true}, nil
	}
	if t.First < 0 || t.First+len(t.Blocks) > len(p.Blocks) {
		return nil, fmt.Errorf("%w: load %d of request %q: blocks [%d, %d) of an offer of %d blocks", connector.ErrBadMetadata, t.ID, t.Req, t.First, t.First+len(t.Blocks), len(p.Blocks))
	}
	return &loadPlan{params: p, remote: p.Blocks[t.First : t.First+len(t.Blocks)]}, nil
}

func (w *Worker) checkBlocks(t *connector.Transfer) error {
	if t.Group != 0 {
		return fmt.Errorf("%w: p2p: transfer %d of request %q names KV cache group %d: this connector moves the one group of a layout without Layout.Groups", connector.ErrBadMetadata, t.ID, t.Req, t.Group)
	}
	for _, b := range t.Blocks {
		if err := w.kv.CheckBlock(b); err != nil {
			return fmt.Errorf("p2p: transfer %d of request %q: %w", t.ID, t.Req, err)
		}
	}
	return nil
}

// armJob is an offer to arm once its digests are in the table.
type armJob struct {
	id     uint64
	slot   int
	seal   seal
	blocks []connector.BlockID
}

// arm computes the digests of each offer's blocks, then, unless Poll
// withdrew the offer meanwhile, writes them into the digest table and arms
// the offer's slot: the digests are there before a consumer may read
// them, and a withdrawn offer is never armed (Poll withdraws under w.mu).
func (w *Worker) arm(jobs []armJob) {
	if w.hooks.beforeArm != nil {
		w.hooks.beforeArm()
	}
	var sums []uint32
	for _, j := range jobs {
		sums = w.sums32(sums[:0], j.blocks)
		w.mu.Lock()
		if _, ok := w.mu.arming[j.id]; ok {
			delete(w.mu.arming, j.id)
			table := w.digests.Bytes()
			for i, b := range j.blocks {
				binary.LittleEndian.PutUint32(table[int(b)*4:], sums[i])
			}
			w.putSeal(j.slot, j.seal)
			w.slot(j.slot).Store(armed(j.id))
		}
		w.mu.Unlock()
	}
	if w.hooks.afterArm != nil {
		w.hooks.afterArm()
	}
}

// sums32 appends the CRC-32 of each of blocks to dst.
func (w *Worker) sums32(dst []uint32, blocks []connector.BlockID) []uint32 {
	for _, b := range blocks {
		dst = append(dst, w.blockSum(b))
	}
	return dst
}

// blockSum returns the CRC-32 (IEEE) of block b's bytes in store order.
func (w *Worker) blockSum(b connector.BlockID) uint32 {
	var buf [8]rdma.Region
	var sum uint32
	for _, sp := range w.kv.Spans(buf[:0], b) {
		sum = crc32.Update(sum, crc32.IEEETable, sp.Bytes())
	}
	return sum
}

// Save implements connector.Worker. Consumers read the blocks a producer
// offers, so there is nothing to push.
func (w *Worker) Save(ctx context.Context, ready connector.Event) error {
	w.life.Lock()
	defer w.life.Unlock()
	if w.closed {
		return connector.ErrClosed
	}
	if w.regs == nil {
		return connector.ErrNotRegistered
	}
	return nil
}

// Poll implements connector.Worker: offers the consumer is done with, or
// that expired, their offer words ended first, and finished loads.
func (w *Worker) Poll() *connector.Output {
	w.life.Lock()
	defer w.life.Unlock()
	w.out.Reset()
	if w.regs == nil {
		return &w.out
	}
	now := w.now()
	for id, h := range w.offers {
		done := w.doneWord(h.slot).Load() == h.ticket
		if !done && !now.After(h.deadline) {
			continue
		}
		// End the offer before the engine may reuse the blocks: a
		// consumer that checks it afterwards drops what it read. An
		// offer still being digested is never armed.
		w.mu.Lock()
		delete(w.mu.arming, id)
		w.slot(h.slot).Store(ended(id))
		if !done {
			w.mu.stats.SaveFailures += 1
		}
		w.mu.Unlock()
		delete(w.offers, id)
		w.out.Done = append(w.out.Done, id)
	}
	w.mu.Lock()
	for _, r := range w.mu.done {
		w.out.Done = append(w.out.Done, r.id)
		w.out.Failed = append(w.out.Failed, r.failures...)
	}
	w.mu.done = w.mu.done[:0]
	w.mu.Unlock()
	return &w.out
}

// load runs one load on its own goroutine and queues its result.
func (w *Worker) load(id uint64, blocks []connector.BlockID, plan *loadPlan) {
	var cell int
	select {
	case cell = <-w.cells:
	case <-w.ctx.Done():
		w.finish(loadResult{id: id, failures: failRange(nil, id, 0, len(blocks), connector.ReasonCanceled)})
		return
	}
	start := time.Now()
	failures, bytes, stuck := w.read(id, blocks, plan, cell)
	if stuck {
		// A transfer of the load may still write its blocks, or its
		// cell: report neither the load (the engine keeps its blocks)
		// nor the cell as free.
		w.log.Error("p2p: load left unreported: the transfer engine cannot tell whether its transfers are over, so its blocks stay in use", "load", id, "offer", plan.params.Offer)
		w.mu.Lock()
		w.mu.unsettled++
		w.mu.Unlock()
		return
	}
	w.cells <- cell
	w.mu.Lock()
	w.mu.stats.TransferNanos += time.Since(start).Nanoseconds()
	if !plan.notify {
		w.mu.stats.Loads += int64(len(blocks) - len(failures))
		w.mu.stats.LoadBytes += bytes
		w.mu.stats.LoadFailures += int64(len(failures))
	}
	w.mu.Unlock()
	w.finish(loadResult{id: id, failures: failures})
}

func (w *Worker) finish(r loadResult) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.done = append(w.mu.done, r)
}

// failRange appends failures of blocks [from, to) of transfer id.
func failRange(dst []connector.Failure, id uint64, from, to int, r connector.Reason) []connector.Failure {
	for i := from; i < to; i++ {
		dst = append(dst, connector.Failure{Transfer: id, Index: i, Reason: r})
	}
	return dst
}

// unsettled returns the number of loads left unreported because a
// transfer's end could not be told.
func (w *Worker) unsettled() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.unsettled
}

// read moves a load's blocks, checks the offer still stood, and tells the
// producer. It returns the failed blocks and the bytes that arrived, or
// stuck when a transfer's end could not be told (errUnsettled): its
// memory may still be written.
func (w *Worker) read(id uint64, blocks []connector.BlockID, plan *loadPlan, cell int) (failures []connector.Failure, bytes int64, stuck bool) {
	p := &plan.params
	peer := p.Ranks[w.rank]
	n := len(blocks)
	unsettled := func(err error) bool {
		if errors.Is(err, errUnsettled) {
			stuck = true
		}
		return stuck
	}
	seg, err := w.segment(peer.Segment)
	if err != nil {
		w.log.Warn("p2p: open producer segment", "segment", peer.Segment, "err", err)
		return failRange(nil, id, 0, n, connector.ReasonIO), 0, false
	}
	// A segment whose transfers fail (its producer restarted or died) is
	// opened again by the next load that needs it.
	segBad := false
	defer func() {
		if segBad && !stuck {
			w.dropSegment(peer.Segment, seg)
		}
	}()
	mailbox := slotAddr(peer.Mailbox, p.Slot)
	cellAt := w.scratch.Region().Addr + uintptr(cell*cellBytes)
	cellIn := rdma.Region{Addr: cellAt, Len: 8, Loc: rdma.Host}
	cellOut := rdma.Region{Addr: cellAt + headerBytes, Len: 8, Loc: rdma.Host}
	// The parameters come from outside (a request body): nothing is read
	// for them, and nothing written, before the memory they name proves
	// to be what they say. A verifying consumer needs the producer's
	// digests.
	refuse := func(why string) []connector.Failure {
		w.log.Warn("p2p: transfer parameters refused", "load", id, "segment", peer.Segment, "offer", p.Offer, "why", why)
		w.mu.Lock()
		w.mu.stats.Refused++
		w.mu.Unlock()
		return failRange(nil, id, 0, n, connector.ReasonCorrupt)
	}
	if w.sums != nil && peer.Digests == 0 {
		return refuse("the producer publishes no digests (digests is 0), and this consumer verifies every block (verify \"checksum\")"), 0, false
	}
	// The mailbox header: the consumer writes its notice into a slot only
	// of memory that holds the mailbox the parameters describe, never
	// into KV memory.
	if ok, err := w.checkMailbox(seg, &peer, cell); err != nil {
		if unsettled(err) {
			return nil, 0, true
		}
		w.log.Warn("p2p: read the producer's mailbox header", "segment", peer.Segment, "offer", p.Offer, "err", err)
		segBad = w.ctx.Err() == nil
		return failRange(nil, id, 0, n, connector.ReasonIO), 0, false
	} else if !ok {
		return refuse("the memory at the mailbox address is not the mailbox of the worker the parameters describe (forged parameters, or its producer restarted)"), 0, false
	}
	// Whatever happens to the blocks, the producer may free them now, also
	// when the offer was not armed yet: the notice goes to the done word,
	// which the producer never writes, so arming does not erase it. Once
	// the offer is known to be gone, its slot may already carry a newer
	// offer, whose notice this one must not overwrite. A load whose
	// transfers may still run tells nothing: the producer gives the offer
	// up after keep_timeout.
	gone, forged := false, false
	defer func() {
		if gone || forged || stuck {
			return
		}
		ticket, _ := parseTicket(p.Ticket) // valid: DecodeParams checked it
		*(*uint64)(unsafe.Pointer(&w.scratch.Bytes()[cell*cellBytes+headerBytes])) = ticket
		r, err := w.transfer([]rdma.Request{{Op: rdma.Write, Local: cellOut, Segment: seg, Remote: mailbox + 8}})
		if unsettled(err) {
			return
		}
		if err != nil || r[0].Status != rdma.Completed {
			w.log.Warn("p2p: tell the producer", "segment", peer.Segment, "offer", p.Offer, "err", err)
		}
	}()
	// The producer's workers arm the offer when its scheduler half makes
	// it (or, in another process, when they start the step after), once
	// its digests are computed, which may come after this consumer got
	// the parameters: wait for it, so that the reads are of this offer's
	// blocks.
	if err := w.awaitArmed(seg, mailbox, cell, p); err != nil {
		if unsettled(err) {
			return nil, 0, true
		}
		if errors.Is(err, errForged) {
			forged = true
			return refuse(err.Error()), 0, false
		}
		w.log.Warn("p2p: offer not armed", "segment", peer.Segment, "offer", p.Offer, "err", err)
		gone = errors.Is(err, errWithdrawn)
		segBad = !gone && !errors.Is(err, errNotArmed) && w.ctx.Err() == nil
		return failRange(nil, id, 0, n, connector.ReasonNotFound), 0, false
	}
	if plan.notify {
		return nil, 0, false
	}
	var sums []byte // the producer's digests of the blocks, read with them
	var sumsAt uintptr
	if w.sums != nil && peer.Digests != 0 {
		per := w.kv.Blocks * 4
		sums = w.sums.Bytes()[cell*per : cell*per+n*4]
		sumsAt = w.sums.Region().Addr + uintptr(cell*per)
	}
	reqs, owner, kvReads, err := w.requests(seg, peer, blocks, plan.remote, sumsAt)
	if err != nil {
		w.log.Warn("p2p: load", "offer", p.Offer, "err", err)
		return failRange(nil, id, 0, n, connector.ReasonIO), 0, false
	}
	results, err := w.transfer(reqs)
	if unsettled(err) {
		return nil, 0, true
	}
	if err != nil {
		w.log.Warn("p2p: load", "offer", p.Offer, "err", err)
		segBad = w.ctx.Err() == nil
		return failRange(nil, id, 0, n, connector.ReasonIO), 0, false
	}
	failAt := n
	for i, r := range results {
		if i < kvReads {
			bytes += r.Bytes
		}
		if r.Status != rdma.Completed {
			failAt = min(failAt, owner[i])
			segBad = segBad || r.Status == rdma.Failed
		}
	}
	// The offer must still stand now that the reads are over: a producer
	// that gave up on it clears its slot before it reuses the blocks.
	check, err := w.transfer([]rdma.Request{{Op: rdma.Read, Local: cellIn, Segment: seg, Remote: mailbox}})
	if unsettled(err) {
		return nil, 0, true
	}
	if err != nil || check[0].Status != rdma.Completed {
		segBad = w.ctx.Err() == nil
		return failRange(nil, id, 0, n, connector.ReasonIO), 0, false
	}
	if v := *(*uint64)(unsafe.Pointer(&w.scratch.Bytes()[cell*cellBytes])); v != armed(p.Offer) {
		gone = true
		return failRange(nil, id, 0, n, connector.ReasonNotFound), 0, false
	}
	// The offer stood while the blocks and their digests were read:
	// every block that arrived must be the producer's.
	reason := connector.ReasonIO
	if sums != nil {
		for i := range failAt {
			if got, want := w.blockSum(blocks[i]), binary.LittleEndian.Uint32(sums[i*4:]); got != want {
				w.log.Warn("p2p: block differs from the producer's", "offer", p.Offer, "index", i, "block", blocks[i], "crc32", got, "producer crc32", want)
				w.mu.Lock()
				w.mu.stats.Corrupt++
				w.mu.Unlock()
				failAt, reason = i, connector.ReasonCorrupt
				break
			}
		}
	}
	if failAt < n {
		return failRange(nil, id, failAt, n, reason), bytes, false
	}
	return nil, bytes, false
}

// errWithdrawn: the producer gave the offer up before the consumer read it.
var errWithdrawn = errors.New("offer withdrawn")

// errNotArmed: the offer was not armed within open_timeout.
var errNotArmed = errors.New("offer not armed")

// errForged: the offer's slot holds the offer, armed, with another seal:
// the parameters are not the ones the producer made it with.
var errForged = errors.New("offer sealed with other parameters")

// checkMailbox reads the header of the mailbox peer names into cell and
// reports whether it is the header of the worker peer describes: its
// magic, then its mailbox seal.
func (w *Worker) checkMailbox(seg rdma.SegmentID, peer *Rank, cell int) (bool, error) {
	at := w.scratch.Region().Addr + uintptr(cell*cellBytes)
	r, err := w.transfer([]rdma.Request{{Op: rdma.Read, Local: rdma.Region{Addr: at, Len: headerBytes, Loc: rdma.Host}, Segment: seg, Remote: uintptr(peer.Mailbox)}})
	if err != nil {
		return false, err
	}
	if r[0].Status != rdma.Completed {
		return false, fmt.Errorf("reading the header: %v", r[0].Status)
	}
	hdr := w.scratch.Bytes()[cell*cellBytes:][:headerBytes]
	want := mailboxSeal(peer)
	return [8]byte(hdr[:8]) == mailboxMagic && [32]byte(hdr[8:40]) == want, nil
}

// awaitArmed reads the slot of offer p until the producer armed it, for
// up to open_timeout, and then checks the slot's seal against p. The
// offer word holds, in turn, the states of the offers that use the slot:
// armed(offer), then ended(offer). A word of an older offer, or 0, means
// this one is not armed yet; this offer's ended word, or a newer offer's,
// means it is gone. An armed slot whose seal is not p's is read once more
// (a read that raced the producer's reuse of the slot may tear), then is
// errForged.
func (w *Worker) awaitArmed(seg rdma.SegmentID, slot uintptr, cell int, p *Params) error {
	at := w.scratch.Region().Addr + uintptr(cell*cellBytes)
	local := rdma.Region{Addr: at, Len: sealAt + len(seal{}), Loc: rdma.Host}
	want := offerSeal(p)
	offer := p.Offer
	deadline := time.Now().Add(w.opt.openTimeout)
	wait := 20 * time.Microsecond
	mismatches := 0
	for {
		r, err := w.transfer([]rdma.Request{{Op: rdma.Read, Local: local, Segment: seg, Remote: slot}})
		if err != nil {
			return err
		}
		if r[0].Status != rdma.Completed {
			return fmt.Errorf("reading the slot: %v", r[0].Status)
		}
		got := w.scratch.Bytes()[cell*cellBytes:][:local.Len]
		v := binary.NativeEndian.Uint64(got)
		switch {
		case v == armed(offer) && [32]byte(got[sealAt:]) == want:
			return nil
		case v == armed(offer):
			if mismatches++; mismatches > 1 {
				return fmt.Errorf("%w: offer %d", errForged, offer)
			}
			continue
		case v == ended(offer) || v>>2 > offer:
			return fmt.Errorf("%w: offer %d (slot holds %#x)", errWithdrawn, offer, v)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: offer %d after %v", errNotArmed, offer, w.opt.openTimeout)
		}
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

// requests builds the reads of blocks from the producer's remote blocks,
// and for each read the index of its (first) block; the first kvReads
// reads are those of the KV bytes. With sums not 0 it also reads the
// producer's digests of the remote blocks to sums, 4 bytes per block, one
// read per run of consecutive remote blocks.
func (w *Worker) requests(seg rdma.SegmentID, peer Rank, blocks, remote []connector.BlockID, sums uintptr) (reqs []rdma.Request, owner []int, kvReads int, err error) {
	rkv, err := peer.cache()
	if err != nil {
		return nil, nil, 0, err
	}
	if rkv.Layers != w.kv.Layers || rkv.KV != w.kv.KV || rkv.BlockBytes != w.kv.BlockBytes {
		return nil, nil, 0, fmt.Errorf("producer layout %d layers x %d x %d bytes, consumer %d x %d x %d",
			rkv.Layers, rkv.KV, rkv.BlockBytes, w.kv.Layers, w.kv.KV, w.kv.BlockBytes)
	}
	whole := w.kv.Order == connector.BlockMajor && rkv.Order == connector.BlockMajor
	var lp, rp []rdma.Region
	for i, b := range blocks {
		lp = pieces(lp[:0], w.kv, b, whole)
		rp = pieces(rp[:0], rkv, remote[i], whole)
		for j := range lp {
			reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: lp[j], Segment: seg, Remote: rp[j].Addr})
			owner = append(owner, i)
		}
	}
	kvReads = len(reqs)
	if sums == 0 {
		return reqs, owner, kvReads, nil
	}
	for i := 0; i < len(remote); {
		j := i + 1
		for j < len(remote) && remote[j] == remote[j-1]+1 {
			j++
		}
		local := rdma.Region{Addr: sums + uintptr(i*4), Len: (j - i) * 4, Loc: rdma.Host}
		reqs = append(reqs, rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: uintptr(peer.Digests) + uintptr(remote[i])*4})
		owner = append(owner, i)
		i = j
	}
	return reqs, owner, kvReads, nil
}

// pieces appends block b's memory to dst: one span when whole (block-major
// memory), else its Layers×KV parts of BlockBytes in store order.
func pieces(dst []rdma.Region, kv connector.KVCache, b connector.BlockID, whole bool) []rdma.Region {
	spans := kv.Spans(nil, b)
	if whole {
		return append(dst, spans...)
	}
	for _, sp := range spans {
		for off := 0; off < sp.Len; off += kv.BlockBytes {
			dst = append(dst, rdma.Region{Addr: sp.Addr + uintptr(off), Len: kv.BlockBytes, Loc: sp.Loc})
		}
	}
	return dst
}

// regionAt is a region of a producer's memory, by address and length (its
// location does not matter to a remote read).
func regionAt(addr uintptr, n int) rdma.Region {
	return rdma.Region{Addr: addr, Len: n, Loc: rdma.Host}
}

// errUnsettled: the engine cannot tell whether a transfer's requests are
// over; they may still move bytes.
var errUnsettled = errors.New("transfer not settled")

// settleWarn is how often a transfer that has not settled is logged.
const settleWarn = 10 * time.Second

// transfer runs reqs in one batch until every request is settled and
// returns their results. Requests that a failing Submit queued anyway are
// waited for like the others before its error is returned, and the batch
// is released only once none is in flight: it is never dropped while a
// request may still write the worker's memory, also when the worker
// closes. An error wrapping errUnsettled means the requests' end is
// unknown: their memory must stay out of use.
func (w *Worker) transfer(reqs []rdma.Request) ([]rdma.Result, error) {
	b, err := w.eng.NewBatch(len(reqs))
	if err != nil {
		return nil, err
	}
	serr := b.Submit(reqs)
	if err := w.settle(b); err != nil {
		return nil, err
	}
	out := make([]rdma.Result, b.Len())
	for i := range out {
		out[i] = b.Result(i)
	}
	if err := b.Release(); err != nil {
		if errors.Is(err, rdma.ErrBusy) {
			// Contradicts the Wait that returned: take the requests
			// to be in flight.
			return nil, fmt.Errorf("%w: release after the requests were final: %w", errUnsettled, err)
		}
		return nil, errors.Join(serr, err)
	}
	if serr != nil {
		return nil, serr
	}
	return out, nil
}

// settle waits until every request of b is settled: a transfer that does
// not settle (a hung device or transport, a dead peer) is waited for, and
// never a reuse of memory it may write. It logs every settleWarn while it
// waits. The wait ends close_timeout after the worker's Close began: the
// requests are then errUnsettled, as when the engine cannot tell (Wait
// fails).
func (w *Worker) settle(b rdma.Batch) error {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(w.retire, settleWarn)
		err := b.Wait(ctx)
		expired := ctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			return nil
		case w.retire.Err() != nil && expired:
			if done, perr := b.Poll(); perr == nil && done {
				return nil
			}
			return fmt.Errorf("%w: %d requests not settled within close_timeout (%v) of Close", errUnsettled, b.Len(), w.opt.closeTimeout)
		case expired && errors.Is(err, context.DeadlineExceeded):
			w.log.Warn("p2p: transfer not settled; its memory stays in use until it is", "requests", b.Len(), "waited", time.Since(start).Round(time.Second))
		default:
			return fmt.Errorf("%w: %d requests: %w", errUnsettled, b.Len(), err)
		}
	}
}

// opening is a producer segment's Open, shared by the loads that need it.
type opening struct {
	done chan struct{} // closed once Open returned
	id   rdma.SegmentID
	err  error
}

// segment returns the engine's handle of the producer segment name,
// opening it once: loads that need a segment whose Open is under way wait
// for that Open, and share its result; loads from other producers are
// not held up (the map is locked only to look up and record, never across
// an Open). A failed Open is forgotten once its waiters have its error,
// so that a later load tries again. It returns early, with an error, when
// the worker closes.
func (w *Worker) segment(name string) (rdma.SegmentID, error) {
	w.segs.Lock()
	o, ok := w.segs.m[name]
	if !ok {
		o = &opening{done: make(chan struct{})}
		w.segs.m[name] = o
	}
	w.segs.Unlock()
	if !ok {
		ctx, cancel := context.WithTimeout(w.ctx, w.opt.openTimeout)
		o.id, o.err = w.eng.Open(ctx, name)
		cancel()
		if o.err != nil {
			w.segs.Lock()
			if w.segs.m[name] == o {
				delete(w.segs.m, name)
			}
			w.segs.Unlock()
		}
		close(o.done)
	} else if w.hooks.openWait != nil {
		select {
		case <-o.done:
		default:
			w.hooks.openWait()
		}
	}
	select {
	case <-o.done:
		return o.id, o.err
	case <-w.ctx.Done():
		return 0, fmt.Errorf("open %q: %w", name, w.ctx.Err())
	}
}

// dropSegment forgets the handle of segment name, if it is still seg,
// and closes it: the next load that needs the segment opens it again.
func (w *Worker) dropSegment(name string, seg rdma.SegmentID) {
	w.segs.Lock()
	o, ok := w.segs.m[name]
	drop := ok && o.err == nil && o.id == seg && isClosed(o.done)
	if drop {
		delete(w.segs.m, name)
	}
	w.segs.Unlock()
	if drop {
		if err := w.eng.CloseSegment(seg); err != nil {
			w.log.Warn("p2p: close a failing producer segment", "segment", name, "err", err)
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Stats implements connector.StatsReporter.
func (w *Worker) Stats() connector.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.stats
}

// Close implements connector.Worker: it stops the loads that have not
// started their transfers, waits for running ones (and so for their
// transfers to settle) for up to kv_connector_extra_config close_timeout
// ("30s"), ends the offers still armed, and withdraws its memory from the
// engine. A transfer that did not settle by then (a dead peer whose
// transport does not give up, a hung device), or whose end the engine
// could not tell, retires the memory it may touch: its load is never
// reported, so the engine keeps its blocks out of use, and Close
// withdraws and frees no memory (the mailbox and scratch it allocated
// stay mapped) and returns an error wrapping [rdma.ErrBusy]: the KV
// memory must not be freed either. So when Close returns nil, no transfer
// of the worker touches the KV memory any more. It is idempotent.
func (w *Worker) Close() error {
	w.life.Lock()
	defer w.life.Unlock()
	if w.closed {
		// A Close that found transfers unsettled freed nothing: a later
		// one frees once they have settled, and says busy until then.
		if w.freed {
			return nil
		}
		return w.free()
	}
	w.closed = true
	w.cancel()
	retire := time.AfterFunc(w.opt.closeTimeout, w.retireNow)
	w.wg.Wait()
	retire.Stop()
	w.retireNow()
	if w.mailbox != nil {
		for id, h := range w.offers {
			w.slot(h.slot).Store(ended(id))
		}
	}
	clear(w.offers)
	w.board.leave(w.rank, w)
	return w.free()
}

// free unregisters the memory and closes an engine the worker opened,
// once no transfer may write it; until then it frees nothing and returns
// an error wrapping rdma.ErrBusy. w.life is held.
func (w *Worker) free() error {
	if n := w.unsettled(); n > 0 {
		// Nothing is withdrawn or freed: the engine may still use it.
		return fmt.Errorf("p2p: close: %d loads have transfers whose end the transfer engine cannot tell: the KV memory, mailbox and scratch they use may still be written, and are not freed: %w", n, rdma.ErrBusy)
	}
	w.freed = true
	err := w.unregister()
	if w.owned {
		err = errors.Join(err, w.eng.Close())
	}
	return err
}

// Engine returns the worker's transfer engine: the one given to New or in
// Env.Engine, or the one it opened (kv_connector_extra_config
// "transfer"), which its Close closes. With "transfer": "shm" the KV
// memory to Register must come from that engine's Alloc:
//
//	mem, err := w.Engine().(*shm.Engine).Alloc(n)
func (w *Worker) Engine() rdma.Engine { return w.eng }
