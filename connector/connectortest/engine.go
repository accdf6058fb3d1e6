package connectortest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

const (
	// poison fills every block that nothing may write: a free block, a
	// block the engine has not computed yet, a block whose load failed. A
	// write into one is seen when the engine next touches the block.
	poison = 0xA5
	// unfinished fills the second half of each block the step computes
	// until the engine has written it all, just before the step's ready
	// event fires: a save that reads the block earlier stores it.
	unfinished = 0xC3
)

// waitBound bounds every wait for a connector's background work: a lookup
// that answers Pending, a transfer not yet reported, a save that has not
// yet looked at its ready event, a goroutine on its way out. It is far
// beyond what any of them takes on a loaded machine; a wait that reaches
// it fails, naming what it waited for.
const waitBound = time.Minute

// idleSteps is how many steps in a row with nothing in flight (no lookup
// pending, no transfer planned and unreported) the harness runs before it
// fails a connector that still keeps a finished request's blocks, or
// whose engines can make no progress: nothing the connector runs in the
// background can change that, so it is a bug.
const idleSteps = 100

// phase is where a request of the model engine is in its life.
type phase uint8

const (
	waiting phase = iota // not admitted: no blocks
	loading              // blocks allocated, external KV loading
	running              // computing its prompt or decoding
	done                 // ended, blocks kept until released
)

func (p phase) String() string {
	return [...]string{"waiting", "loading", "running", "done"}[p]
}

// entry names entry i of the block table of KV cache group g.
type entry struct{ g, i int }

// gblock names engine block b of KV cache group g: each group has its own
// memory and block ids.
type gblock struct {
	g int
	b connector.BlockID
}

// freq is one request of the model engine.
type freq struct {
	num      int // its number in the engine (see admit: odd and even requests hold different blocks outside a sliding window)
	conn     connector.Request
	tokens   []hashing.Token
	chain    *hashing.Chain
	tables   [][]connector.BlockID // per KV cache group: its block table, connector.NoBlock where it holds no block
	computed int                   // tokens whose KV is in its blocks
	decode   int                   // tokens still to generate
	phase    phase
	admitted uint64 // admission order: the youngest is preempted first
	gen      uint64 // the generation its KV is computed in
	matched  bool   // the connector has seen it
	failed   bool   // its load failed under policy fail
	snap     uint64 // the store recorder's sequence number at its first Match

	// Its load: the match covers the chain's blocks [loadFrom,
	// loadFrom+loadN); in group g it fills the entries [loadLo[g],
	// loadFrom+loadN).
	inLoad   bool
	loadFrom int
	loadN    int
	loadLo   []int
	named    map[entry]bool // entries a load transfer of a Plan named
	failures map[entry]bool // entries some worker reported failed
	loads    []uint64       // its load transfers some worker has not reported done
	failAt   int            // lowest entry, in any group, some worker failed to load; -1 if none
	rotated  bool           // the generation changed while its load ran

	pendingSince time.Time // when Match began to answer Pending; zero if it does not
	learned      int       // blocks whose parent and tokens the world knows (world.learn)
}

// tables0 returns its block table of group 0, nil before it was admitted.
func (r *freq) tables0() []connector.BlockID {
	if len(r.tables) == 0 {
		return nil
	}
	return r.tables[0]
}

// loadEnd returns the block boundary its load resumes at.
func (r *freq) loadEnd() int { return r.loadFrom + r.loadN }

// block is the engine's record of one KV block.
type block struct {
	owner  *freq
	cached bool              // in the local prefix cache
	hash   hashing.BlockHash // valid when cached
	lru    uint64            // last use, for cached blocks
	clean  bool              // holds poison, and nothing may write it
	failed bool              // clean because its load was reported failed
}

// pool is the paged memory of one KV cache group: its blocks, the free
// ones, and its part of the local prefix cache.
type pool struct {
	blocks []block
	free   []connector.BlockID
	cache  map[hashing.BlockHash]connector.BlockID
}

// event is the ready event of one worker for one step. It records that the
// worker looked at it: the engine finishes the step's KV only once every
// worker with a save of it waits.
type event struct {
	fired   atomic.Bool
	touched atomic.Bool
	ch      chan struct{}
}

func newEvent() *event { return &event{ch: make(chan struct{})} }

func (e *event) Query() (bool, error) {
	e.touched.Store(true)
	return e.fired.Load(), nil
}

func (e *event) fire() {
	e.fired.Store(true)
	close(e.ch)
}

// waitEvent is an event that can also be waited for (connector.Waiter).
type waitEvent struct{ *event }

func (e waitEvent) Wait(ctx context.Context) error {
	e.touched.Store(true)
	select {
	case <-e.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// xfer is a transfer some Plan named that some worker has not yet reported
// done.
type xfer struct {
	id     uint64
	load   bool
	req    connector.RequestID
	group  int
	first  int
	n      int
	blocks []connector.BlockID // the engine blocks of its group it names
	left   []bool              // per rank: not yet reported done
	nleft  int                 // ranks not yet reported done
	fails  [][]bool            // per rank, per block: reported failed
	since  time.Time
}

// engine is a model of an inference engine with paged KV memory: a local
// prefix cache, requests that share prefixes, chunked prefill, decode,
// preemption, and KV bytes that are a known function of the namespace
// (tenant, model, generation, layout...), the KV cache group, the shard
// and the block hash, so that any block the connector loads can be
// checked byte for byte.
//
// With a hybrid layout it keeps a block table per group, as vLLM's hybrid
// allocator does: every block in the full-attention group; in the
// sliding-window group the blocks of the window, freeing (NoBlock) those
// that fall out of it; in the state group the states at some block
// boundaries only (the ends of its steps, and every stateEvery-th
// boundary), NoBlock elsewhere.
type engine struct {
	w          *world
	t          tb
	label      string // names its requests
	id         hashing.Identity
	ns         hashing.Namespace
	gens       map[uint64]hashing.Namespace // every generation it ran
	groups     []hashing.Group              // the layout's KV cache groups; group 0 is full attention
	stateEvery int                          // keeps the state at every stateEvery-th block boundary (0: at the ends of steps only)
	pair       Pair
	policy     connector.Policy
	waiter     bool                    // its ready events implement connector.Waiter
	layered    []connector.LayerWorker // per rank, when it drives its workers layer by layer (every one a connector.LayerWorker); nil otherwise
	// probeLoads and probeSaves, with layered, make the next step that
	// loads (that saves) watch for a WaitLayer that returns before the
	// loads could have arrived (a SaveLayer that saves a later layer): see
	// computeLayers.
	probeLoads, probeSaves bool
	// cancel, with layered, makes the next step that loads cancel its
	// first WaitLayer while the store holds every get (see cancelWait).
	cancel cancelHow
	kv     []connector.KVCache // per rank, as registered
	mem    []Memory
	pools  []pool // per group
	// unowned is, per group, per block, whether no request owns the
	// block (free or in the local prefix cache): read by the store's
	// recorder, which fails a put of such a block (see recorder.checkFreed).
	unowned  [][]atomic.Bool
	reqs     []*freq // admitted or waiting, in arrival order
	kept     map[connector.RequestID]*freq
	clock    uint64
	admits   uint64
	nextReq  int
	lastStep uint64
	outs     []*connector.Output // Outputs polled since the last Update, copied
	xfers    map[uint64]*xfer
	events   []connector.KVEvent
	stats    engineStats
	want     wantStats
	offers   []offer           // see below
	history  [][]hashing.Token // prompts of requests that ended, in this generation
	closed   bool
}

// offer is a prompt this engine finished whose blocks its connector keeps
// for another instance, with the transfer parameters to hand on
// (connector.TransferParamsSource).
type offer struct {
	prompt []hashing.Token
	params []byte
}

type engineStats struct {
	localHits, externalHits, loads, failedLoads, finished, preempted, released int
}

// wantStats is what the connector's Stats must say, from what the engine
// saw.
type wantStats struct {
	hitBlocks, hitTokens, loadFailures int64   // scheduler half
	loads, workerLoadFailures, corrupt []int64 // per worker
}

// tb is the part of testing.TB and *rapid.T the engine uses.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// stateBytes is the size of one state of one layer of the hybrid layout's
// state group, in one shard.
const stateBytes = 48

func newEngine(w *world, s spec, id hashing.Identity, pair Pair) (*engine, error) {
	ns, err := id.Namespace()
	if err != nil {
		return nil, err
	}
	tp := id.Layout.TPSize
	e := &engine{
		w:          w,
		t:          w.t,
		label:      s.label,
		id:         id,
		ns:         ns,
		gens:       map[uint64]hashing.Namespace{id.Generation: ns},
		groups:     ns.Groups(),
		stateEvery: s.stateEvery,
		pair:       pair,
		policy:     s.policy,
		waiter:     s.waiter,
		kept:       make(map[connector.RequestID]*freq),
		xfers:      make(map[uint64]*xfer),
		want: wantStats{
			loads:              make([]int64, tp),
			workerLoadFailures: make([]int64, tp),
			corrupt:            make([]int64, tp),
		},
	}
	e.probeLoads, e.probeSaves, e.cancel = s.probe, s.probe, s.cancel
	if s.layered {
		for _, w := range pair.Workers {
			lw, ok := w.(connector.LayerWorker)
			if !ok {
				e.layered = nil
				break
			}
			e.layered = append(e.layered, lw)
		}
	}
	if e.groups[0].Kind != hashing.FullAttention {
		return e, fmt.Errorf("the harness's layouts start with a full-attention group, not %s", e.groups[0].Kind)
	}
	for rank := range pair.Workers {
		var kv connector.KVCache
		for _, g := range e.groups {
			gc := connector.KVCache{Layers: len(g.Layers), Blocks: s.blocks, KV: 2, BlockBytes: cmp.Or(s.blockBytes, 64), Order: s.order}
			if g.Kind == hashing.RecurrentState {
				gc.KV, gc.BlockBytes = 1, g.StateBytes
			}
			var m Memory
			var err error
			if n := gc.Layers * gc.KV * gc.Blocks * gc.BlockBytes; pair.Alloc != nil {
				if m, err = pair.Alloc(rank, n); err == nil && (m.Region().Len != n || len(m.Bytes()) != n) {
					err = errors.Join(fmt.Errorf("Pair.Alloc(%d, %d) returned %d bytes (region of %d)", rank, n, len(m.Bytes()), m.Region().Len), m.Free())
				}
			} else {
				m, err = rdma.AllocHost(n)
			}
			if err != nil {
				return e, err
			}
			e.mem = append(e.mem, m)
			fill(m.Bytes(), poison)
			gc.Regions = []rdma.Region{m.Region()}
			if len(e.groups) == 1 {
				kv = gc
			} else {
				kv.Groups = append(kv.Groups, gc)
			}
		}
		if err := pair.Workers[rank].Register(kv); err != nil {
			return e, fmt.Errorf("worker %d: Register: %w", rank, err)
		}
		e.kv = append(e.kv, kv)
	}
	e.unowned = make([][]atomic.Bool, len(e.groups))
	for g := range e.unowned {
		e.unowned[g] = make([]atomic.Bool, s.blocks)
		for b := range e.unowned[g] {
			e.unowned[g][b].Store(true)
		}
		for rank := range e.kv {
			w.rec.mapMemory(e, rank, g, e.kv[rank].Group(g), e.unowned[g])
		}
	}
	e.pools = make([]pool, len(e.groups))
	for g := range e.pools {
		p := &e.pools[g]
		p.blocks = make([]block, s.blocks)
		p.cache = make(map[hashing.BlockHash]connector.BlockID)
		for b := s.blocks - 1; b >= 0; b-- {
			p.free = append(p.free, connector.BlockID(b))
			p.blocks[b].clean = true
		}
	}
	return e, nil
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func all(b []byte, v byte) bool {
	for _, c := range b {
		if c != v {
			return false
		}
	}
	return true
}

// content writes into dst the bytes of block h of KV cache group g in
// shard shard of namespace ns: what a model would compute, the KV of the
// block's tokens or, in a state group, the state after them. Every field
// of the identity (through the namespace digest), the group, the shard and
// the hash change them.
func content(dst []byte, ns hashing.Namespace, g, shard int, h hashing.BlockHash) {
	d := ns.Digest()
	seed := binary.LittleEndian.Uint64(h[:8]) ^ binary.LittleEndian.Uint64(h[8:16])*0x94d049bb133111eb ^
		binary.LittleEndian.Uint64(d[:8]) ^ uint64(shard+1)*0xbf58476d1ce4e5b9 ^ uint64(g)*0xd6e8feb86659fd93
	for i := 0; i+8 <= len(dst); i += 8 {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
}

// hybrid reports whether the engine's layout has several KV cache groups.
func (e *engine) hybrid() bool { return len(e.groups) > 1 }

// blk returns the record of block b of group g.
func (e *engine) blk(g int, b connector.BlockID) *block { return &e.pools[g].blocks[b] }

// shard returns the shard of group g that rank holds.
func (e *engine) shard(g, rank int) int { return e.ns.GroupShard(g, rank) }

// entryName names entry i of group g's table, for messages: "block i"
// with one group.
func (e *engine) entryName(g, i int) string {
	if !e.hybrid() {
		return fmt.Sprintf("block %d", i)
	}
	switch spec := e.groups[g]; spec.Kind {
	case hashing.SlidingWindow:
		return fmt.Sprintf("block %d of group %d (sliding_window of %d tokens)", i, g, spec.Window)
	case hashing.RecurrentState:
		return fmt.Sprintf("entry %d of group %d (state: the state after block %d)", i, g, i)
	}
	return fmt.Sprintf("block %d of group %d (%s)", i, g, e.groups[g].Kind)
}

// engineBlock names engine block b of group g, for messages.
func (e *engine) engineBlock(g int, b connector.BlockID) string {
	if !e.hybrid() {
		return fmt.Sprintf("engine block %d", b)
	}
	return fmt.Sprintf("engine block %d of group %d", b, g)
}

// what returns what a block of group g holds: KV, or a state.
func (e *engine) what(g int) string {
	if e.groups[g].Kind == hashing.RecurrentState {
		return "state"
	}
	return "KV"
}

// blockBytes gathers block b of group g of worker rank, in store order.
func (e *engine) blockBytes(rank, g int, b connector.BlockID) []byte {
	var dst []byte
	for _, sp := range e.kv[rank].Group(g).Spans(nil, b) {
		dst = append(dst, sp.Bytes()...)
	}
	return dst
}

// blockSize returns the bytes of one block of group g in worker rank.
func (e *engine) blockSize(rank, g int) int { return e.kv[rank].Group(g).BlockSize() }

// put scatters src (store order) into block b of group g of worker rank.
func (e *engine) put(rank, g int, b connector.BlockID, src []byte) {
	for _, sp := range e.kv[rank].Group(g).Spans(nil, b) {
		n := copy(sp.Bytes(), src)
		src = src[n:]
	}
}

// poisonBlock fills block b of group g with poison in every worker.
func (e *engine) poisonBlock(g int, b connector.BlockID) {
	for rank := range e.kv {
		for _, sp := range e.kv[rank].Group(g).Spans(nil, b) {
			fill(sp.Bytes(), poison)
		}
	}
}

// expectPoison fails the test unless block b of group g holds poison in
// every worker; what says which block it is, for the message.
func (e *engine) expectPoison(g int, b connector.BlockID, what string) {
	e.t.Helper()
	for rank := range e.kv {
		if got := e.blockBytes(rank, g, b); !all(got, poison) {
			why := "which nothing may write"
			switch {
			case e.blk(g, b).failed:
				why = "after its load was reported failed"
			case e.blk(g, b).owner == nil:
				why = "after the engine freed it"
			}
			e.t.Fatalf("%s: %s (%s), rank %d, was written %s%s", e.label, e.engineBlock(g, b), what, rank, why, e.explain(got, g, rank, nil, nil))
		}
	}
}

// checkBlock fails the test unless block b holds, in every worker, the KV
// (or state) of entry i of group g of r in the current generation.
func (e *engine) checkBlock(what string, r *freq, g, i int, b connector.BlockID) {
	e.t.Helper()
	h := r.conn.Hashes[i]
	for rank := range e.kv {
		want := make([]byte, e.blockSize(rank, g))
		content(want, e.ns, g, e.shard(g, rank), h)
		if got := e.blockBytes(rank, g, b); !bytes.Equal(got, want) {
			e.t.Fatalf("%s, request %s: %s %s, in %s, rank %d: bytes differ from the %s saved for its key (generation %d)%s",
				e.label, r.conn.ID, what, e.entryName(g, i), e.engineBlock(g, b), rank, e.what(g), e.id.Generation, e.explain(got, g, rank, &h, r))
		}
	}
}

// explain says what the bytes of a block of group g are, when they are
// not what they should be: poison, an unfinished write, the KV or state
// of another position of r, another group's, namespace's or shard's.
func (e *engine) explain(got []byte, g, rank int, h *hashing.BlockHash, r *freq) string {
	if all(got, poison) {
		return ": the block was never written (still poisoned)"
	}
	half := len(got) / 2
	if all(got[half:], unfinished) {
		return ": its second half is the engine's unfinished write: the block was read before the step's ready event fired"
	}
	if h == nil {
		return ""
	}
	want := make([]byte, len(got))
	if r != nil {
		i := slices.Index(r.conn.Hashes, *h)
		for k, hk := range r.conn.Hashes {
			if k == i {
				continue
			}
			content(want, e.ns, g, e.shard(g, rank), hk)
			if !bytes.Equal(got, want) {
				continue
			}
			if e.groups[g].Kind == hashing.RecurrentState {
				return fmt.Sprintf(": it holds the state after block %d, not after block %d: a state of another position", k, i)
			}
			return fmt.Sprintf(": it holds the KV of the request's block %d, not of block %d: a block loaded into another entry", k, i)
		}
	}
	for _, o := range e.w.engines {
		for gen, ns := range o.gens {
			for og := range ns.Groups() {
				for shard := range ns.GroupShards(og) {
					content(want, ns, og, shard, *h)
					if !bytes.Equal(got, want) {
						continue
					}
					switch {
					case o == e && gen != e.id.Generation:
						return fmt.Sprintf(": it holds the block's %s of generation %d of this identity, shard %d: a stale generation", e.what(g), gen, shard)
					case ns == e.ns && og != g:
						return fmt.Sprintf(": it holds the block's bytes of group %d (%s), not of group %d (%s): KV cache groups crossed", og, e.groups[og].Kind, g, e.groups[g].Kind)
					case ns == e.ns:
						return fmt.Sprintf(": it holds the block's %s of shard %d, not of rank %d's shard %d", e.what(g), shard, rank, e.shard(g, rank))
					default:
						return fmt.Sprintf(": it holds the block's KV of %s's identity (%s, generation %d), shard %d: KV crossed identities", o.label, ns, gen, shard)
					}
				}
			}
		}
	}
	return ": the bytes are no KV the harness knows (a torn, scribbled or misplaced read)"
}

// windowStart returns the first block a sliding window of w tokens needs
// to resume at block boundary p (blocks of bs tokens): the token at p×bs
// attends to itself and the w−1 tokens before it, so the block holding
// token p×bs−w+1, or 0.
func windowStart(p, bs, w int) int {
	first := p*bs - w + 1
	if first <= 0 {
		return 0
	}
	return first / bs
}

// needFrom returns the first entry of group g's table, at or after from,
// that resuming at block boundary p needs: from for full attention (every
// block before p), the window before p for a sliding window, the state
// after block p−1 for a state group. It is p when the group needs nothing
// there.
func (e *engine) needFrom(g, from, p int) int {
	lo := from
	switch spec := e.groups[g]; spec.Kind {
	case hashing.SlidingWindow:
		lo = max(from, windowStart(p, e.id.Layout.BlockSize, spec.Window))
	case hashing.RecurrentState:
		lo = max(from, p-1)
	}
	return min(lo, p)
}

// resumable reports whether every group has what resuming at block
// boundary p needs, ok saying which entries hold it.
func (e *engine) resumable(p int, ok func(g, i int) bool) bool {
	for g := range e.groups {
		for i := e.needFrom(g, 0, p); i < p; i++ {
			if !ok(g, i) {
				return false
			}
		}
	}
	return true
}

// resumeEnd returns the largest block boundary in (lo, hi] that is
// resumable with the entries ok says hold what they should, or lo.
func (e *engine) resumeEnd(lo, hi int, ok func(g, i int) bool) int {
	for p := hi; p > lo; p-- {
		if e.resumable(p, ok) {
			return p
		}
	}
	return lo
}

// needWhy says what resuming at block boundary p needs of group g, for
// messages.
func (e *engine) needWhy(g, p int) string {
	bs := e.id.Layout.BlockSize
	switch spec := e.groups[g]; spec.Kind {
	case hashing.SlidingWindow:
		return fmt.Sprintf("the token at %d attends to tokens %d to %d (a window of %d): resuming at block %d needs the blocks holding them, [%d, %d)",
			p*bs, max(0, p*bs-spec.Window+1), p*bs, spec.Window, p, e.needFrom(g, 0, p), p)
	case hashing.RecurrentState:
		return fmt.Sprintf("resuming at block %d needs the state after block %d: a match ends only at a boundary whose state some engine saved", p, p-1)
	}
	return fmt.Sprintf("resuming at block %d needs every block before it", p)
}

// alloc takes a free block of group g, evicting the least recently used
// cached block of the group when none is free. It checks that nothing
// wrote the block since it was freed.
func (e *engine) alloc(r *freq, g int) (connector.BlockID, bool) {
	e.t.Helper()
	p := &e.pools[g]
	if len(p.free) == 0 && !e.evictFrom(g) {
		return 0, false
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	e.expectPoison(g, b, "free")
	p.blocks[b] = block{owner: r, clean: true}
	e.unowned[g][b].Store(false)
	return b, true
}

// ensure gives entry i of r's table of group g a block, if it holds none.
// It cannot fail: a request holds blocks of a group other than group 0
// only at entries where it holds one of group 0, so a group never holds
// more blocks than group 0, and every group has as many.
func (e *engine) ensure(r *freq, g, i int) {
	e.t.Helper()
	if r.tables[g][i] != connector.NoBlock {
		return
	}
	b, ok := e.alloc(r, g)
	if !ok {
		e.t.Fatalf("%s: the harness found no free block of group %d for %s of request %s", e.label, g, e.entryName(g, i), r.conn.ID)
	}
	r.tables[g][i] = b
}

// release returns a block to the free list, poisoned. A block that was to
// hold poison is checked first.
func (e *engine) release(g int, b connector.BlockID) {
	e.t.Helper()
	if e.blk(g, b).clean {
		what := "never computed"
		if o := e.blk(g, b).owner; o != nil {
			what = fmt.Sprintf("of request %s, never computed", o.conn.ID)
		}
		e.expectPoison(g, b, what)
	}
	e.unowned[g][b].Store(true)
	e.poisonBlock(g, b)
	*e.blk(g, b) = block{clean: true}
	e.pools[g].free = append(e.pools[g].free, b)
}

// retire frees block b of group g, which held block h of a request: to
// the local prefix cache when valid says it holds what it should, else to
// the free list.
func (e *engine) retire(g int, b connector.BlockID, h hashing.BlockHash, valid bool) {
	e.t.Helper()
	if valid && !e.blk(g, b).clean {
		if _, dup := e.pools[g].cache[h]; !dup {
			e.clock++
			*e.blk(g, b) = block{cached: true, hash: h, lru: e.clock}
			e.unowned[g][b].Store(true)
			e.pools[g].cache[h] = b
			return
		}
	}
	e.release(g, b)
}

// lruOf returns the least recently used cached block of group g, or -1.
func (e *engine) lruOf(g int) connector.BlockID {
	var victim connector.BlockID = -1
	for _, b := range e.pools[g].cache {
		if victim < 0 || e.blk(g, b).lru < e.blk(g, victim).lru || e.blk(g, b).lru == e.blk(g, victim).lru && b < victim {
			victim = b
		}
	}
	return victim
}

// evictFrom evicts the least recently used cached block of group g.
func (e *engine) evictFrom(g int) bool {
	e.t.Helper()
	victim := e.lruOf(g)
	if victim < 0 {
		return false
	}
	delete(e.pools[g].cache, e.blk(g, victim).hash)
	e.release(g, victim)
	return true
}

// evictOne evicts the least recently used cached block of any group.
func (e *engine) evictOne() bool {
	e.t.Helper()
	best, lru := -1, uint64(0)
	for g := range e.pools {
		if v := e.lruOf(g); v >= 0 && (best < 0 || e.blk(g, v).lru < lru) {
			best, lru = g, e.blk(g, v).lru
		}
	}
	return best >= 0 && e.evictFrom(best)
}

// evict drops block h of group g from the local prefix cache, if cached.
func (e *engine) evict(g int, h hashing.BlockHash) {
	e.t.Helper()
	if b, ok := e.pools[g].cache[h]; ok {
		delete(e.pools[g].cache, h)
		e.release(g, b)
	}
}

// dropCache empties the local prefix cache.
func (e *engine) dropCache() {
	e.t.Helper()
	for g := range e.pools {
		c := e.pools[g].cache
		for _, b := range slices.Sorted(maps.Values(c)) {
			delete(c, e.blk(g, b).hash)
			e.release(g, b)
		}
	}
}

// cached counts the blocks of the local prefix cache.
func (e *engine) cached() int {
	n := 0
	for g := range e.pools {
		n += len(e.pools[g].cache)
	}
	return n
}

// add queues a new request with the given prompt that generates decode
// tokens after it.
func (e *engine) add(prompt []hashing.Token, decode int) { e.addWith(prompt, decode, nil) }

// addWith queues a request that arrived with transfer parameters.
func (e *engine) addWith(prompt []hashing.Token, decode int, params []byte) {
	e.t.Helper()
	e.nextReq++
	e.w.count.requests++
	chain, err := hashing.NewChain(e.id.Layout.BlockSize)
	if err != nil {
		e.t.Fatalf("NewChain: %v", err)
	}
	r := &freq{num: e.nextReq, tokens: slices.Clone(prompt), chain: chain, decode: decode, gen: e.id.Generation, failAt: -1}
	r.conn.ID = connector.RequestID(fmt.Sprintf("%s-r%d", e.label, e.nextReq))
	r.conn.Prompt = len(prompt)
	r.conn.TransferParams = params
	chain.Append(nil, prompt...)
	r.conn.Hashes = chain.Hashes()
	e.giveTokens(r)
	e.w.learn(r)
	e.reqs = append(e.reqs, r)
}

// giveTokens passes r's tokens in its Request (connector.Request.Tokens)
// for even-numbered requests; odd ones go without, so that both kinds of
// BlockStored events are checked.
func (e *engine) giveTokens(r *freq) {
	if r.num%2 == 0 {
		r.conn.Tokens = r.tokens
	}
}

// localHit returns the longest local prefix hit of r, never the last
// prompt token: the largest block boundary at which every group can
// resume from the local prefix cache.
func (e *engine) localHit(r *freq) int {
	limit := (len(r.tokens) - 1) / e.id.Layout.BlockSize
	return e.resumeEnd(0, limit, func(g, i int) bool {
		_, ok := e.pools[g].cache[r.conn.Hashes[i]]
		return ok
	})
}

// admit tries to start a waiting request: local prefix hit, external match
// beyond it, allocation of its blocks, Allocated. It reports whether the
// request was admitted.
//
// In group 0 (full attention) the request gets a block for every entry.
// In a sliding-window group it takes from the cache the blocks of the
// window before its local hit, and gets blocks for the window before the
// match's end and for everything after it; the entries between the local
// hit and that window are NoBlock for odd requests, as vLLM's allocator
// leaves them, and blocks for even ones, which the engine frees once the
// load is done. In a state group it takes the state at its local hit, gets
// a block for the state at the match's end, and holds no other.
func (e *engine) admit(r *freq) bool {
	e.t.Helper()
	bs := e.id.Layout.BlockSize
	hashes := r.conn.Hashes
	local := e.localHit(r)
	if !r.matched {
		r.snap = e.w.rec.seqNow()
	}
	r.matched = true
	m, err := e.pair.Planner.Match(&r.conn, local*bs)
	if err != nil {
		e.t.Fatalf("Match(%s, %d): %v", r.conn.ID, local*bs, err)
	}
	if m.Pending {
		if m.Tokens != 0 {
			e.t.Fatalf("Match(%s) = %d tokens and Pending, want 0 tokens while pending", r.conn.ID, m.Tokens)
		}
		if r.pendingSince.IsZero() {
			r.pendingSince = time.Now()
		}
		return false
	}
	r.pendingSince = time.Time{}
	if m.Tokens < 0 || m.Tokens%bs != 0 {
		e.t.Fatalf("Match(%s) = %d tokens, not a whole number of %d-token blocks", r.conn.ID, m.Tokens, bs)
	}
	if local*bs+m.Tokens >= len(r.tokens) {
		e.t.Fatalf("Match(%s) = %d tokens beyond %d: covers the last prompt token of a %d-token prompt", r.conn.ID, m.Tokens, local*bs, len(r.tokens))
	}
	n := m.Tokens / bs
	p := local + n
	e.w.checkMatch(e, r, local, n)
	nb := (len(r.tokens) + bs - 1) / bs
	if len(e.pools[0].free)+len(e.pools[0].cache)-local < nb-local {
		return false // no room yet
	}
	r.tables = make([][]connector.BlockID, len(e.groups))
	for g := range e.groups {
		r.tables[g] = slices.Repeat([]connector.BlockID{connector.NoBlock}, nb)
		for i := e.needFrom(g, 0, local); i < local; i++ {
			c := e.pools[g].cache
			b := c[hashes[i]]
			delete(c, hashes[i])
			e.checkBlock("locally cached", r, g, i, b)
			*e.blk(g, b) = block{owner: r}
			e.unowned[g][b].Store(false)
			r.tables[g][i] = b
		}
	}
	r.loadLo = make([]int, len(e.groups))
	for g, spec := range e.groups {
		lo := e.needFrom(g, local, p)
		r.loadLo[g] = lo
		from, to := local, nb
		switch spec.Kind {
		case hashing.SlidingWindow:
			if r.num%2 == 1 {
				from = lo
			}
		case hashing.RecurrentState:
			from, to = lo, p
		}
		for i := from; i < to; i++ {
			if g > 0 {
				e.ensure(r, g, i)
				continue
			}
			b, ok := e.alloc(r, g)
			if !ok {
				e.t.Fatalf("%s: out of blocks after checking room", e.label)
			}
			r.tables[g][i] = b
		}
	}
	if err := e.pair.Planner.Allocated(&r.conn, m.Tokens, r.tables...); err != nil {
		e.t.Fatalf("Allocated(%s, %d blocks, %d): %v", r.conn.ID, len(r.tables[0]), m.Tokens, err)
	}
	e.admits++
	r.admitted = e.admits
	r.computed = local * bs
	e.stats.localHits += local
	if n > 0 {
		r.phase = loading
		r.inLoad = true
		r.loadFrom, r.loadN = local, n
		r.named, r.failures = make(map[entry]bool), make(map[entry]bool)
		r.failAt = -1
		for g := range e.groups {
			for i := r.loadLo[g]; i < p; i++ {
				e.blk(g, r.tables[g][i]).clean = false // the load writes it
			}
		}
		e.stats.externalHits += n
		e.want.hitBlocks += int64(n)
		e.want.hitTokens += int64(m.Tokens)
	} else {
		r.phase = running
	}
	return true
}

// youngest returns the admitted request (loading or running) admitted last.
func (e *engine) youngest() *freq {
	var y *freq
	for _, r := range e.reqs {
		if (r.phase == loading || r.phase == running) && (y == nil || r.admitted > y.admitted) {
			y = r
		}
	}
	return y
}

// grow gives r one more entry: a block of group 0, NoBlock in the other
// groups until the engine computes into it. When group 0 has no free
// block it preempts the youngest admitted request, r itself when r is the
// youngest, so that the oldest always progresses; it reports whether r
// got the block.
func (e *engine) grow(r *freq) bool {
	e.t.Helper()
	for {
		if b, ok := e.alloc(r, 0); ok {
			r.tables[0] = append(r.tables[0], b)
			for g := 1; g < len(r.tables); g++ {
				r.tables[g] = append(r.tables[g], connector.NoBlock)
			}
			return true
		}
		if v := e.youngest(); v != r {
			e.preempt(v)
			continue
		}
		admitted := 0
		for _, q := range e.reqs {
			if q.phase == loading || q.phase == running {
				admitted++
			}
		}
		if admitted > 1 || len(e.kept) == 0 {
			e.preempt(r)
		}
		// else r waits for the blocks finished requests keep.
		return false
	}
}

// sweep frees, as vLLM does for the requests it schedules, the
// sliding-window blocks of r that fell out of the window of every token
// still to come, once no unfinished transfer names them: their entries
// become NoBlock, which the step's Scheduled call passes on. (A block
// freed without a call that says so could be reused while a connector
// still means to save it, which no connector can tell.)
func (e *engine) sweep(r *freq) {
	e.t.Helper()
	if !e.hybrid() {
		return
	}
	var busy map[gblock]bool // the blocks unfinished transfers name
	bs := e.id.Layout.BlockSize
	for g, spec := range e.groups {
		if spec.Kind != hashing.SlidingWindow {
			continue
		}
		// The token at r.computed, the next one, attends to tokens from
		// r.computed-Window+1 on.
		for i, b := range r.tables[g] {
			if (i+1)*bs > r.computed-spec.Window+1 {
				break
			}
			if b == connector.NoBlock {
				continue
			}
			if busy == nil {
				busy = make(map[gblock]bool)
				for _, x := range e.xfers {
					for _, xb := range x.blocks {
						busy[gblock{x.group, xb}] = true
					}
				}
			}
			if busy[gblock{g, b}] {
				continue
			}
			e.retire(g, b, r.conn.Hashes[i], r.gen == e.id.Generation)
			r.tables[g][i] = connector.NoBlock
		}
	}
}

// fresh is an entry a step computes.
type fresh struct {
	r    *freq
	g, i int
}

// prepare gives r the blocks a step that computes its tokens [c, to)
// writes, and returns the entries it completes: in full attention and a
// sliding window every block it completes (a sliding window gets a block
// for each block it touches), in a state group the states it keeps, at
// the step's end when that is a block boundary and at every
// stateEvery-th boundary.
func (e *engine) prepare(r *freq, c, to int) []fresh {
	e.t.Helper()
	bs := e.id.Layout.BlockSize
	var out []fresh
	for g, spec := range e.groups {
		switch spec.Kind {
		case hashing.FullAttention:
			for i := c / bs; i < to/bs; i++ {
				out = append(out, fresh{r, g, i})
			}
		case hashing.SlidingWindow:
			for i := c / bs; i < (to+bs-1)/bs; i++ {
				e.ensure(r, g, i)
				if i < to/bs {
					out = append(out, fresh{r, g, i})
				}
			}
		case hashing.RecurrentState:
			for i := c / bs; i < to/bs; i++ {
				if (i+1)*bs == to || e.stateEvery > 0 && (i+1)%e.stateEvery == 0 {
					e.ensure(r, g, i)
					out = append(out, fresh{r, g, i})
				}
			}
		}
	}
	return out
}

// step runs one engine step, chunk limiting the prompt tokens a request
// computes in it (0: no limit), and reports whether anything changed: a
// request admitted, computed, ended or preempted, a transfer reported.
func (e *engine) step(ctx context.Context, chunk int) bool {
	e.t.Helper()
	e.w.count.steps++
	bs := e.id.Layout.BlockSize
	progress := false
	// Decode first, oldest admitted first, as engines schedule running
	// requests before they admit waiting ones: one generated token, a
	// function of the last.
	order := slices.Clone(e.reqs)
	sort.SliceStable(order, func(i, j int) bool { return order[i].admitted < order[j].admitted })
	for _, r := range order {
		if r.phase != running || r.computed < len(r.tokens) || r.decode == 0 || !slices.Contains(e.reqs, r) {
			continue
		}
		if need := (len(r.tokens) + bs) / bs; need > len(r.tables[0]) {
			preempted := e.stats.preempted
			got := e.grow(r)
			if e.stats.preempted != preempted {
				progress = true
			}
			if !got {
				continue
			}
		}
		next := (r.tokens[len(r.tokens)-1]*31 + 7) % 50000
		r.tokens = append(r.tokens, next)
		r.chain.Append(nil, next)
		r.conn.Hashes = r.chain.Hashes()
		e.giveTokens(r)
		e.w.learn(r)
		r.decode--
	}
	for _, r := range slices.Clone(e.reqs) {
		if r.phase == waiting && e.admit(r) {
			progress = true
		}
	}
	// The step's compute: the entries each request completes.
	var computed []fresh
	for _, r := range e.reqs {
		if r.phase != running || r.computed == len(r.tokens) {
			continue
		}
		to := len(r.tokens)
		if chunk > 0 && to-r.computed > chunk {
			to = r.computed + chunk
		}
		e.sweep(r)
		computed = append(computed, e.prepare(r, r.computed, to)...)
		if err := e.pair.Planner.Scheduled(&r.conn, to, r.tables...); err != nil {
			e.t.Fatalf("Scheduled(%s, %d): %v", r.conn.ID, to, err)
		}
		r.computed = to
		progress = true
	}
	blocks := make(map[gblock]bool, len(computed))
	for _, c := range computed {
		blocks[gblock{c.g, c.r.tables[c.g][c.i]}] = true
	}
	meta := e.pair.Planner.Plan()
	e.checkPlan(meta, blocks)
	planned, err := meta.MarshalBinary()
	if err != nil {
		e.t.Fatalf("%s: Plan's Metadata: MarshalBinary: %v", e.label, err)
	}
	// While the step computes, its blocks are unready: a save must not
	// read them until the worker's ready event fires.
	var unready []span
	for _, c := range computed {
		b := c.r.tables[c.g][c.i]
		for rank := range e.kv {
			for _, sp := range e.kv[rank].Group(c.g).Spans(nil, b) {
				unready = append(unready, span{sp.Addr, sp.End(), fmt.Sprintf("%s's %s (%s of request %s, rank %d)", e.label, e.engineBlock(c.g, b), e.entryName(c.g, c.i), c.r.conn.ID, rank)})
			}
		}
	}
	e.w.rec.setUnready(unready)
	probe := e.layered != nil && (e.probeLoads || e.cancel != cancelNone) && len(meta.Loads) > 0
	if probe {
		e.w.rec.holdGets() // released in computeLayers
	}
	events := make([]*event, len(e.pair.Workers))
	for rank, w := range e.pair.Workers {
		events[rank] = newEvent()
		if err := w.Start(ctx, meta); err != nil {
			e.t.Fatalf("%s: worker %d: Start: %v", e.label, rank, err)
		}
	}
	if early := e.w.rec.earlyRead(); early != "" {
		e.t.Fatalf("%s: %s", e.label, early)
	}
	if e.layered != nil {
		e.computeLayers(ctx, meta, computed, probe)
		if e.update() {
			progress = true
		}
		e.checkKept(meta, planned)
		return e.endStep(progress)
	}
	// The first half of each block, and garbage in the rest.
	e.startCompute(computed, func(buf []byte, c fresh, rank int) {
		content(buf, e.ns, c.g, e.shard(c.g, rank), c.r.conn.Hashes[c.i])
		fill(buf[len(buf)/2:], unfinished)
	})
	for rank, w := range e.pair.Workers {
		var ev connector.Event = events[rank]
		if e.waiter {
			ev = waitEvent{events[rank]}
		}
		if err := w.Save(ctx, ev); err != nil {
			e.t.Fatalf("%s: worker %d: Save: %v", e.label, rank, err)
		}
	}
	if len(computed) > 0 {
		e.awaitSaves(meta, blocks, events)
	}
	for _, c := range computed {
		for rank := range e.kv {
			buf := make([]byte, e.blockSize(rank, c.g))
			content(buf, e.ns, c.g, e.shard(c.g, rank), c.r.conn.Hashes[c.i])
			e.put(rank, c.g, c.r.tables[c.g][c.i], buf)
		}
	}
	e.w.rec.setUnready(nil)
	for _, ev := range events {
		ev.fire()
	}
	if early := e.w.rec.earlyRead(); early != "" {
		e.t.Fatalf("%s: %s", e.label, early)
	}
	if e.update() {
		progress = true
	}
	e.checkKept(meta, planned)
	return e.endStep(progress)
}

// checkKept fails unless the step's Metadata still holds what Plan
// returned (planned, encoded): it is valid until the next Plan, so the
// engine may still read it after Update, and the workers only read it.
func (e *engine) checkKept(meta *connector.Metadata, planned []byte) {
	e.t.Helper()
	now, err := meta.MarshalBinary()
	if err != nil {
		e.t.Fatalf("%s: the step's Metadata after Update: MarshalBinary: %v", e.label, err)
	}
	if !bytes.Equal(now, planned) {
		e.t.Fatalf("%s: the Metadata Plan returned for step %d changed by the step's end (Start, Save, Poll, Update): it is read-only and valid until the next Plan, and the engine may read it after Update", e.label, meta.Step)
	}
}

// probeGrace is how long a probe gives a worker to do what it must not:
// return from WaitLayer while every get is held, or hand the store a
// layer not yet computed. A correct worker never does, however long the
// wait, so no machine is too slow for it; a broken one is caught unless
// its goroutine does not run for that long.
const probeGrace = 100 * time.Millisecond

// probeWait calls WaitLayer(0) of every worker on goroutines of its own
// while the store holds every get of the step's loads, which it lets go
// probeGrace after the first reaches it: a WaitLayer that returns before
// is a worker that reports a layer in before its bytes are.
func (e *engine) probeWait(ctx context.Context, meta *connector.Metadata) {
	e.t.Helper()
	defer e.w.rec.releaseGets()
	done := make(chan error, len(e.layered))
	for _, lw := range e.layered {
		go func() { done <- lw.WaitLayer(ctx, 0) }()
	}
	early := func(err error) {
		e.t.Helper()
		e.w.rec.releaseGets()
		e.t.Fatalf("%s: a worker's WaitLayer(0) in step %d returned (err %v) while the store held every get, before it had answered one: the layer's bytes of loads %v cannot have arrived", e.label, meta.Step, err, transferIDs(meta.Loads))
	}
	start := time.Now()
	var p pause
	for e.w.rec.getsHeld() == 0 {
		select {
		case err := <-done:
			early(err)
		default:
		}
		if time.Since(start) > waitBound {
			e.w.rec.releaseGets()
			e.w.gaveUp("%s: no get of the loads %v of step %d reached the store in %v after Start", e.label, transferIDs(meta.Loads), meta.Step, waitBound)
		}
		p.sleep()
	}
	t := time.NewTimer(probeGrace)
	select {
	case err := <-done:
		t.Stop()
		early(err)
	case <-t.C:
	}
	e.w.rec.releaseGets()
	for range e.layered {
		if err := <-done; err != nil {
			e.t.Fatalf("%s: WaitLayer(0) in step %d: %v", e.label, meta.Step, err)
		}
	}
}

// cancelHow is how a step's first WaitLayer's context ends while the
// layer's loads run (see cancelWait).
type cancelHow uint8

const (
	cancelNone     cancelHow = iota
	cancelCancel             // the context is canceled
	cancelDeadline           // the context's deadline passes
)

func (c cancelHow) String() string {
	return [...]string{"", "Cancel", "Deadline"}[c]
}

// cancelWait calls WaitLayer(0) of every worker on goroutines of its own,
// with a context that ends (canceled, or its deadline passed) while the
// store holds every get of the step's loads, so the layer cannot be in:
// each must return an error wrapping the context's. The harness waits for
// that on the condition: a WaitLayer that has not returned once the
// context is done, while every goroutine of the process is blocked (none
// is running that could still make it return) for silentNews looks in a
// row over a second or more, ignores its context; one that returns nil
// reports a layer in that cannot have arrived. Then the store lets the
// gets go, and the step waits on layer 0 again, as the contract allows:
// the loads still end, each reported once, byte for byte.
func (e *engine) cancelWait(meta *connector.Metadata) {
	e.t.Helper()
	defer e.w.rec.releaseGets()
	what := "canceled"
	ctx, cancel := context.WithCancel(context.Background())
	if e.cancel == cancelDeadline {
		// The deadline may pass before a get reaches the store: the
		// loads cannot end before the harness lets the gets go either way.
		what = "past its deadline"
		ctx, cancel = context.WithTimeout(context.Background(), probeGrace)
	}
	defer cancel()
	type result struct {
		rank int
		err  error
	}
	done := make(chan result, len(e.layered))
	for rank, lw := range e.layered {
		go func() { done <- result{rank, lw.WaitLayer(ctx, 0)} }()
	}
	left := len(e.layered)
	check := func(r result) {
		e.t.Helper()
		left--
		// A held get that returned on its own context's end (the
		// connector's timeout of a store call, on a machine slow enough)
		// failed its load: the layer is then in, as the contract counts.
		_, quit := e.w.rec.heldSince()
		switch {
		case r.err == nil && quit > 0:
		case r.err == nil:
			e.w.rec.releaseGets()
			e.t.Fatalf("%s: worker %d's WaitLayer(0) in step %d returned nil while the store held every get of loads %v (its context %s): it reported a layer in that cannot have arrived", e.label, r.rank, meta.Step, transferIDs(meta.Loads), what)
		case ctx.Err() == nil && quit == 0:
			e.w.rec.releaseGets()
			e.t.Fatalf("%s: worker %d's WaitLayer(0) in step %d = %v before its context ended, while the store held every get of loads %v: it waits until the layer is in", e.label, r.rank, meta.Step, r.err, transferIDs(meta.Loads))
		case ctx.Err() != nil && !errors.Is(r.err, ctx.Err()):
			e.w.rec.releaseGets()
			e.t.Fatalf("%s: worker %d's WaitLayer(0) in step %d = %v once its context was %s while the layer's loads ran, want an error wrapping the context's (%v)", e.label, r.rank, meta.Step, r.err, what, ctx.Err())
		}
	}
	start := time.Now()
	var p pause
	for reached, _ := e.w.rec.heldSince(); reached == 0 && left > 0; reached, _ = e.w.rec.heldSince() {
		select {
		case r := <-done:
			check(r)
		default:
		}
		if time.Since(start) > waitBound {
			e.w.rec.releaseGets()
			e.w.gaveUp("%s: no get of the loads %v of step %d reached the store in %v after Start", e.label, transferIDs(meta.Loads), meta.Step, waitBound)
		}
		p.sleep()
	}
	if e.cancel == cancelDeadline {
		<-ctx.Done() // probeGrace after it began
	} else {
		cancel()
	}
	ended := time.Now()
	p.reset()
	stillBlocked := 0
	for left > 0 {
		select {
		case r := <-done:
			check(r)
			stillBlocked = 0
			continue
		default:
		}
		if quiescent() {
			stillBlocked++
		} else {
			stillBlocked = 0
		}
		if stillBlocked >= silentNews && time.Since(ended) > time.Second {
			e.w.rec.releaseGets()
			e.t.Fatalf("%s: a worker's WaitLayer(0) in step %d had not returned %v after its context was %s, with every goroutine of the process blocked (none running that could still make it return) while the store held every get of the layer's loads: a WaitLayer returns ctx's error once ctx is done, however long the loads take", e.label, meta.Step, time.Since(ended).Round(time.Millisecond), what)
		}
		if time.Since(ended) > waitBound {
			e.w.rec.releaseGets()
			e.w.gaveUp("%s: a worker's WaitLayer(0) in step %d had not returned %v after its context was %s: a WaitLayer returns ctx's error once ctx is done", e.label, meta.Step, waitBound, what)
		}
		p.sleep()
	}
	e.w.count.canceledWaits++
}

func transferIDs(ts []connector.Transfer) []uint64 {
	ids := make([]uint64, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	return ids
}

// startCompute marks the blocks the step computes as written, checking
// that a block that was clean still holds poison, and fills each with
// what first(buf, c, rank) writes into a buffer of the block's bytes.
func (e *engine) startCompute(computed []fresh, first func(buf []byte, c fresh, rank int)) {
	e.t.Helper()
	for _, c := range computed {
		b := c.r.tables[c.g][c.i]
		if e.blk(c.g, b).clean {
			e.expectPoison(c.g, b, fmt.Sprintf("%s of request %s, about to be computed", e.entryName(c.g, c.i), c.r.conn.ID))
		}
		e.blk(c.g, b).clean, e.blk(c.g, b).failed = false, false
		for rank := range e.kv {
			buf := make([]byte, e.blockSize(rank, c.g))
			first(buf, c, rank)
			e.put(rank, c.g, b, buf)
		}
	}
}

// endStep ends the requests that are complete, after a step.
func (e *engine) endStep(progress bool) bool {
	for _, r := range slices.Clone(e.reqs) {
		if r.failed || r.phase == running && r.computed == len(r.tokens) && r.decode == 0 {
			e.reqs = slices.DeleteFunc(e.reqs, func(q *freq) bool { return q == r })
			e.finish(r, false)
			progress = true
		}
	}
	return progress
}

// layerOf returns the position of model layer l in group g's layers, or
// -1 when g does not hold it.
func (e *engine) layerOf(g, l int) int { return slices.Index(e.groups[g].Layers, l) }

// layerBytes returns the bytes of layer li (of group g's layers) of block
// b of worker rank, K before V.
func (e *engine) layerBytes(rank, g int, b connector.BlockID, li int) []byte {
	var dst []byte
	for _, sp := range e.kv[rank].Group(g).LayerSpans(nil, b, li, li+1) {
		dst = append(dst, sp.Bytes()...)
	}
	return dst
}

// putLayer writes layer li of src, a whole block in store order, into
// block b of group g of worker rank.
func (e *engine) putLayer(rank, g int, b connector.BlockID, li int, src []byte) {
	kv := e.kv[rank].Group(g)
	src = src[li*kv.KV*kv.BlockBytes:]
	for _, sp := range kv.LayerSpans(nil, b, li, li+1) {
		n := copy(sp.Bytes(), src)
		src = src[n:]
	}
}

// layerSnap is what a worker's memory held of one layer of one block of a
// load right after WaitLayer returned for the layer.
type layerSnap struct {
	t     *connector.Transfer
	rank  int
	i, li int // block index in t, layer position in t's group
	l     int // model layer
	got   []byte
}

// computeLayers runs the step's compute layer by layer, as an engine
// whose workers are connector.LayerWorkers does: every layer of the
// blocks the step computes holds unfinished bytes until its turn; for
// each model layer in order every worker's WaitLayer returns, the layer
// is computed, and every worker's SaveLayer is called; then Save. A save
// that reads a layer before its turn reads unfinished bytes (or, going
// through the store's put, is seen reading a block the step computes).
// What the loads had put in place of each layer when WaitLayer returned
// is kept, and checked once the workers report the loads: the Poll after
// WaitLayer of the last layer must report every load of the step, and
// every block it reports loaded must have held each layer's bytes when
// that layer's WaitLayer returned.
//
// With probe, the store holds every get of the step's loads: WaitLayer(0)
// runs on other goroutines, and must not return before the harness lets
// the gets go (a while after the first reached the store), since none of
// the loads' bytes can have arrived. With probeSaves, after each
// SaveLayer the harness waits a while before it computes the layer, and
// after firing the layer's event a while before the next layer: a worker
// that saves a layer before its event fires, or a later layer, has handed
// the store that memory by then.
func (e *engine) computeLayers(ctx context.Context, meta *connector.Metadata, computed []fresh, probe bool) {
	e.t.Helper()
	e.w.count.layerSteps++
	probeSaves := e.probeSaves && len(computed) > 0
	waited := false // WaitLayer(0) returned nil already
	switch {
	case probe && e.cancel != cancelNone:
		e.cancelWait(meta)
		e.cancel = cancelNone
	case probe:
		e.probeLoads = false
		e.probeWait(ctx, meta)
		waited = true
	}
	if probeSaves {
		e.probeSaves = false
	}
	e.startCompute(computed, func(buf []byte, _ fresh, _ int) { fill(buf, unfinished) })
	var snaps []layerSnap
	layers := e.id.Layout.Layers
	for l := range layers {
		for rank, lw := range e.layered {
			if waited && l == 0 {
				break // probeWait waited
			}
			if err := lw.WaitLayer(ctx, l); err != nil {
				e.t.Fatalf("%s: worker %d: WaitLayer(%d) in step %d: %v", e.label, rank, l, meta.Step, err)
			}
		}
		for ti := range meta.Loads {
			t := &meta.Loads[ti]
			li := e.layerOf(t.Group, l)
			if li < 0 {
				continue
			}
			for rank := range e.kv {
				for i, b := range t.Blocks {
					snaps = append(snaps, layerSnap{t: t, rank: rank, i: i, li: li, l: l, got: e.layerBytes(rank, t.Group, b, li)})
				}
			}
		}
		// SaveLayer(l) as an engine on a device calls it: once layer l's
		// compute is queued, with an event that fires when it is done.
		// Until then layer l is unready too.
		evs := make([]*event, len(e.layered))
		for rank, lw := range e.layered {
			evs[rank] = newEvent()
			var ev connector.Event = evs[rank]
			if e.waiter {
				ev = waitEvent{evs[rank]}
			}
			if err := lw.SaveLayer(ctx, l, ev); err != nil {
				e.t.Fatalf("%s: worker %d: SaveLayer(%d) in step %d: %v", e.label, rank, l, meta.Step, err)
			}
		}
		if probeSaves {
			time.Sleep(probeGrace) // a save that does not wait for the event reads layer l unready
		}
		// Compute layer l; the layers after it stay unready.
		var unready []span
		for _, c := range computed {
			b := c.r.tables[c.g][c.i]
			li := e.layerOf(c.g, l)
			for rank := range e.kv {
				if li >= 0 {
					buf := make([]byte, e.blockSize(rank, c.g))
					content(buf, e.ns, c.g, e.shard(c.g, rank), c.r.conn.Hashes[c.i])
					e.putLayer(rank, c.g, b, li, buf)
				}
				for _, later := range e.groups[c.g].Layers {
					if later <= l {
						continue
					}
					for _, sp := range e.kv[rank].Group(c.g).LayerSpans(nil, b, e.layerOf(c.g, later), e.layerOf(c.g, later)+1) {
						unready = append(unready, span{sp.Addr, sp.End(), fmt.Sprintf("%s's %s (%s of request %s, rank %d), whose layer %d the step had not computed yet (its SaveLayer's ready event had not fired)", e.label, e.engineBlock(c.g, b), e.entryName(c.g, c.i), c.r.conn.ID, rank, later)})
					}
				}
			}
		}
		if early := e.w.rec.earlyRead(); early != "" {
			e.t.Fatalf("%s: %s", e.label, early)
		}
		e.w.rec.setUnready(unready)
		for _, ev := range evs {
			ev.fire()
		}
		if probeSaves && l < layers-1 {
			time.Sleep(probeGrace)
		}
		if early := e.w.rec.earlyRead(); early != "" {
			e.t.Fatalf("%s: %s", e.label, early)
		}
	}
	xs := make(map[uint64]*xfer, len(meta.Loads))
	for _, t := range meta.Loads {
		xs[t.ID] = e.xfers[t.ID]
	}
	for rank := range e.layered {
		e.poll(rank)
		for _, t := range meta.Loads {
			if x := xs[t.ID]; x != nil && x.left[rank] {
				e.t.Fatalf("%s: worker %d: the Poll after WaitLayer(%d), the last layer, does not report load transfer %d of step %d (request %s): a LayerWorker's loads have all ended by then", e.label, rank, layers-1, t.ID, meta.Step, t.Req)
			}
		}
	}
	for _, sn := range snaps {
		x := xs[sn.t.ID]
		if x == nil || x.fails[sn.rank][sn.i] {
			continue
		}
		ns, ok := e.gens[meta.Generation]
		if !ok {
			continue
		}
		want := make([]byte, e.blockSize(sn.rank, sn.t.Group))
		content(want, ns, sn.t.Group, e.shard(sn.t.Group, sn.rank), sn.t.Hashes[sn.i])
		kv := e.kv[sn.rank].Group(sn.t.Group)
		per := kv.KV * kv.BlockBytes
		e.w.count.layerChecks++
		if w := want[sn.li*per : (sn.li+1)*per]; !bytes.Equal(sn.got, w) {
			got := "other bytes"
			switch {
			case all(sn.got, poison):
				got = "poison"
			case all(sn.got, unfinished):
				got = "an unfinished write"
			}
			e.t.Fatalf("%s: worker %d: WaitLayer(%d) in step %d returned before layer %d of block %d (entry %d of load transfer %d, request %s) was in: it held %s, and the worker then reported the block loaded", e.label, sn.rank, sn.l, meta.Step, sn.l, sn.t.Blocks[sn.i], sn.t.First+sn.i, sn.t.ID, sn.t.Req, got)
		}
	}
	for rank, w := range e.pair.Workers {
		if err := w.Save(ctx, connector.Ready); err != nil {
			e.t.Fatalf("%s: worker %d: Save: %v", e.label, rank, err)
		}
	}
	e.w.rec.setUnready(nil)
	if early := e.w.rec.earlyRead(); early != "" {
		e.t.Fatalf("%s: %s", e.label, early)
	}
}

// awaitSaves waits, with the step's KV unfinished, until every worker with
// a save of a block the step computes either looked at its ready event
// (Query or Wait) or reported those saves done: a worker that saves
// without waiting for the event has then read the unfinished blocks.
func (e *engine) awaitSaves(meta *connector.Metadata, computed map[gblock]bool, events []*event) {
	e.t.Helper()
	var ids []uint64
	for _, t := range meta.Saves {
		if slices.ContainsFunc(t.Blocks, func(b connector.BlockID) bool { return computed[gblock{t.Group, b}] }) {
			ids = append(ids, t.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	start := time.Now()
	var p pause
	for rank := range e.pair.Workers {
		for !events[rank].touched.Load() && !e.reported(rank, ids) {
			if early := e.w.rec.earlyRead(); early != "" {
				e.t.Fatalf("%s: %s", e.label, early)
			}
			if time.Since(start) > waitBound {
				e.w.gaveUp("%s: worker %d neither looked at step %d's ready event (Query or Wait) nor reported its saves %v of blocks the step computes in %v: a worker waits for the event from its own goroutines or from Poll",
					e.label, rank, meta.Step, ids, waitBound)
			}
			p.sleep()
			e.poll(rank)
		}
	}
	e.w.count.waitedSaves++
}

// reported reports whether worker rank reported every transfer of ids done.
func (e *engine) reported(rank int, ids []uint64) bool {
	for _, id := range ids {
		if x := e.xfers[id]; x != nil && x.left[rank] {
			return false
		}
	}
	return true
}

// holds describes what a table entry holds, for messages.
func holds(b connector.BlockID) string {
	if b == connector.NoBlock {
		return "no block (NoBlock)"
	}
	return fmt.Sprintf("engine block %d", b)
}

// loadWhy says why a load must not fill entry j of group g of r.
func (e *engine) loadWhy(r *freq, g, j int) string {
	bs := e.id.Layout.BlockSize
	p := r.loadEnd()
	switch spec := e.groups[g]; {
	case j >= p:
		return fmt.Sprintf("it is past the match, which ends at block %d", p)
	case j < r.loadFrom:
		return fmt.Sprintf("it is the engine's own (its local hit covers blocks [0, %d)): a load writes only what the match needs beyond it", r.loadFrom)
	case spec.Kind == hashing.SlidingWindow:
		return fmt.Sprintf("it is outside the window: the token at %d attends to tokens %d to %d (a window of %d), so resuming there needs blocks [%d, %d) of the group",
			p*bs, max(0, p*bs-spec.Window+1), p*bs, spec.Window, r.loadLo[g], p)
	case spec.Kind == hashing.RecurrentState:
		return fmt.Sprintf("it is the state after block %d, and resuming at block %d needs only the state after block %d", j, p, p-1)
	}
	return fmt.Sprintf("the load is of blocks [%d, %d)", r.loadFrom, p)
}

// hashName says which block of r a hash names, for messages.
func hashName(r *freq, h hashing.BlockHash) string {
	if k := slices.Index(r.conn.Hashes, h); k >= 0 {
		return fmt.Sprintf("the hash of block %d", k)
	}
	return "a hash that names no block of the request"
}

// checkPlan checks a step's Metadata and tracks its transfers: each names
// its request's own blocks, in their entries of their group, and hashes;
// a load only entries that resuming at its match's end needs beyond the
// local hit; a save only entries the engine computed or loaded, or
// computes in this step (computed).
func (e *engine) checkPlan(m *connector.Metadata, computed map[gblock]bool) {
	e.t.Helper()
	if m.Generation != e.id.Generation {
		e.t.Fatalf("%s: Plan().Generation = %d, want %d", e.label, m.Generation, e.id.Generation)
	}
	if m.Step <= e.lastStep && e.lastStep > 0 {
		e.t.Fatalf("%s: Plan().Step = %d after step %d: steps increase", e.label, m.Step, e.lastStep)
	}
	e.lastStep = m.Step
	bs := e.id.Layout.BlockSize
	for _, list := range []struct {
		load bool
		ts   []connector.Transfer
	}{{true, m.Loads}, {false, m.Saves}} {
		kind := "save"
		if list.load {
			kind = "load"
		}
		for _, t := range list.ts {
			if _, dup := e.xfers[t.ID]; dup {
				e.t.Fatalf("%s: Plan names %s transfer %d, whose id an unfinished transfer has", e.label, kind, t.ID)
			}
			if len(t.Blocks) != len(t.Hashes) {
				e.t.Fatalf("%s: Plan's %s transfer %d has %d blocks and %d hashes", e.label, kind, t.ID, len(t.Blocks), len(t.Hashes))
			}
			g := t.Group
			if g < 0 || g >= len(e.groups) {
				e.t.Fatalf("%s: Plan's %s transfer %d names KV cache group %d, but the layout has %d", e.label, kind, t.ID, g, len(e.groups))
			}
			tp := len(e.pair.Workers)
			x := &xfer{id: t.ID, load: list.load, req: t.Req, group: g, first: t.First, n: len(t.Blocks), blocks: slices.Clone(t.Blocks),
				left: make([]bool, tp), nleft: tp, fails: make([][]bool, tp), since: time.Now()}
			for rank := range tp {
				x.left[rank] = true
				x.fails[rank] = make([]bool, len(t.Blocks))
			}
			if len(t.Blocks) > 0 {
				r := e.find(t.Req)
				if r == nil {
					e.t.Fatalf("%s: Plan's %s transfer %d names request %s, which the engine neither runs nor keeps", e.label, kind, t.ID, t.Req)
				}
				for i, b := range t.Blocks {
					j := t.First + i
					switch {
					case j < 0 || j >= len(r.tables[g]) || j >= len(r.conn.Hashes):
						e.t.Fatalf("%s: Plan's %s transfer %d names %s of request %s, which has %d entries and %d full blocks", e.label, kind, t.ID, e.entryName(g, j), t.Req, len(r.tables[g]), len(r.conn.Hashes))
					case b == connector.NoBlock || r.tables[g][j] != b:
						e.t.Fatalf("%s: Plan's %s transfer %d names %s as %s of request %s, which holds %s there", e.label, kind, t.ID, holds(b), e.entryName(g, j), t.Req, holds(r.tables[g][j]))
					case r.conn.Hashes[j] != t.Hashes[i]:
						e.t.Fatalf("%s: Plan's %s transfer %d names %s of request %s with %s", e.label, kind, t.ID, e.entryName(g, j), t.Req, hashName(r, t.Hashes[i]))
					}
				}
				if list.load {
					if !r.inLoad {
						e.t.Fatalf("%s: Plan loads blocks [%d, %d) of request %s, which is not loading", e.label, t.First, t.First+len(t.Blocks), t.Req)
					}
					for i, b := range t.Blocks {
						j := t.First + i
						if j < r.loadLo[g] || j >= r.loadEnd() {
							if !e.hybrid() {
								e.t.Fatalf("%s: Plan loads blocks [%d, %d) of request %s, which asked for [%d, %d)", e.label, t.First, t.First+len(t.Blocks), t.Req, r.loadFrom, r.loadEnd())
							}
							e.t.Fatalf("%s: Plan's load transfer %d loads %s of request %s, into %s, which resuming at block %d does not need: %s",
								e.label, t.ID, e.entryName(g, j), t.Req, e.engineBlock(g, b), r.loadEnd(), e.loadWhy(r, g, j))
						}
						r.named[entry{g, j}] = true
					}
					r.loads = append(r.loads, t.ID)
				} else {
					if t.First+len(t.Blocks) > r.computed/bs {
						e.t.Fatalf("%s: Plan saves blocks [%d, %d) of request %s, which has computed %d tokens (%d full blocks)", e.label, t.First, t.First+len(t.Blocks), t.Req, r.computed, r.computed/bs)
					}
					for i, b := range t.Blocks {
						if e.blk(g, b).clean && !computed[gblock{g, b}] {
							e.t.Fatalf("%s: Plan saves %s of request %s, from %s, which holds no %s: the engine neither computed nor loaded it", e.label, e.entryName(g, t.First+i), t.Req, e.engineBlock(g, b), e.what(g))
						}
					}
				}
			}
			e.xfers[t.ID] = x
		}
	}
}

// poll takes worker rank's Output, copies it for the next Update and
// tracks what it reports. It reports whether it reported anything.
func (e *engine) poll(rank int) bool {
	e.t.Helper()
	o := e.pair.Workers[rank].Poll()
	if o == nil {
		e.t.Fatalf("%s: worker %d: Poll returned nil", e.label, rank)
	}
	if o.Rank != rank {
		e.t.Fatalf("%s: worker %d: Poll returned Output.Rank = %d", e.label, rank, o.Rank)
	}
	cp := &connector.Output{Rank: o.Rank, Done: slices.Clone(o.Done), Failed: slices.Clone(o.Failed)}
	e.outs = append(e.outs, cp)
	for _, f := range cp.Failed {
		x := e.xfers[f.Transfer]
		switch {
		case x == nil:
			e.t.Fatalf("%s: worker %d reports block %d of transfer %d failed, which no unfinished transfer of a Plan is", e.label, rank, f.Index, f.Transfer)
		case !x.left[rank]:
			e.t.Fatalf("%s: worker %d reports block %d of transfer %d failed after it reported the transfer done", e.label, rank, f.Index, f.Transfer)
		case f.Index < 0 || f.Index >= max(x.n, 1):
			e.t.Fatalf("%s: worker %d reports block %d of transfer %d failed, which has %d blocks", e.label, rank, f.Index, f.Transfer, x.n)
		}
		if x.n == 0 || x.fails[rank][f.Index] {
			continue
		}
		x.fails[rank][f.Index] = true
		if !x.load {
			continue
		}
		e.w.loadFailed = true
		if f.Reason != connector.ReasonStale {
			e.want.workerLoadFailures[rank]++
		}
		if f.Reason == connector.ReasonCorrupt {
			e.want.corrupt[rank]++
		}
		if r := e.find(x.req); r != nil && r.failures != nil {
			j := x.first + f.Index
			r.failures[entry{x.group, j}] = true
			if r.failAt < 0 || j < r.failAt {
				r.failAt = j
			}
		}
	}
	for _, id := range cp.Done {
		x := e.xfers[id]
		switch {
		case x == nil:
			e.t.Fatalf("%s: worker %d reports transfer %d done, which no unfinished transfer of a Plan is", e.label, rank, id)
		case !x.left[rank]:
			e.t.Fatalf("%s: worker %d reports transfer %d done twice", e.label, rank, id)
		}
		x.left[rank] = false
		x.nleft--
		if x.load && x.n > 0 {
			ok := int64(x.n)
			for _, f := range x.fails[rank] {
				if f {
					ok--
				}
			}
			e.want.loads[rank] += ok
		}
		if x.nleft == 0 {
			delete(e.xfers, id)
			if r := e.find(x.req); r != nil {
				r.loads = slices.DeleteFunc(r.loads, func(l uint64) bool { return l == id })
			}
		}
	}
	return len(cp.Done)+len(cp.Failed) > 0
}

// checkLoaded checks a request whose load Progress listed as loaded: a
// load transfer named every entry that resuming at the match's end needs
// beyond the local hit, each holds the bytes saved for its key, and every
// other block the request holds is what it was: the engine's own bytes,
// or poison.
func (e *engine) checkLoaded(r *freq) {
	e.t.Helper()
	p := r.loadEnd()
	for g := range e.groups {
		for i := r.loadLo[g]; i < p; i++ {
			if !r.named[entry{g, i}] {
				e.t.Fatalf("%s: Progress.Loaded names %s, but no load transfer named %s, which resuming at block %d needs: %s", e.label, r.conn.ID, e.entryName(g, i), p, e.needWhy(g, p))
			}
		}
	}
	for g := range e.groups {
		for i, b := range r.tables[g] {
			switch {
			case b == connector.NoBlock:
			case e.blk(g, b).clean:
				e.expectPoison(g, b, fmt.Sprintf("%s of request %s, which resuming at block %d does not need", e.entryName(g, i), r.conn.ID, p))
			case i >= r.loadLo[g] && i < p:
				e.checkBlock("loaded", r, g, i, b)
			default:
				e.checkBlock("the engine's own", r, g, i, b)
			}
		}
	}
}

// validEnd returns the longest prefix r can resume from after its load
// failed: the largest block boundary in [loadFrom, loadEnd] at which every
// group has what it needs in the request's local blocks and the entries
// its load transfers named and no worker failed.
func (e *engine) validEnd(r *freq) int {
	return e.resumeEnd(r.loadFrom, r.loadEnd(), func(g, i int) bool {
		return i < r.loadFrom || i >= r.loadLo[g] && r.named[entry{g, i}] && !r.failures[entry{g, i}]
	})
}

// update polls every worker, hands the Outputs to the scheduler half and
// acts on its Progress. It reports whether anything changed.
func (e *engine) update() bool {
	e.t.Helper()
	progress := false
	for rank := range e.pair.Workers {
		if e.poll(rank) {
			progress = true
		}
	}
	p, err := e.pair.Planner.Update(e.outs)
	if err != nil {
		e.t.Fatalf("%s: Update: %v", e.label, err)
	}
	e.outs = e.outs[:0]
	bs := e.id.Layout.BlockSize
	for _, id := range p.Loaded {
		r := e.find(id)
		if r == nil || !r.inLoad {
			e.t.Fatalf("%s: Progress.Loaded names %s, which is not loading", e.label, id)
		}
		if len(r.loads) > 0 {
			e.t.Fatalf("%s: Progress.Loaded names %s, but some worker has not reported its load transfer %d done", e.label, id, r.loads[0])
		}
		if r.failAt >= 0 && !r.rotated {
			e.t.Fatalf("%s: Progress.Loaded names %s, but a worker reported %s of its load failed", e.label, id, e.failedName(r))
		}
		r.inLoad = false
		progress = true
		e.w.count.loads++
		e.w.count.loadedBlocks += r.loadN
		if r.phase == done {
			if r.gen == e.id.Generation {
				e.checkLoaded(r)
			}
			continue
		}
		e.checkLoaded(r)
		e.stats.loads++
		r.computed = r.loadEnd() * bs
		r.phase = running
	}
	for _, f := range p.Failed {
		r := e.find(f.Req)
		if r == nil || !r.inLoad {
			e.t.Fatalf("%s: Progress.Failed names %s, which is not loading", e.label, f.Req)
		}
		if len(r.loads) > 0 {
			e.t.Fatalf("%s: Progress.Failed names %s, but some worker has not reported its load transfer %d done: it may still write the blocks", e.label, f.Req, r.loads[0])
		}
		from, end := r.loadFrom*bs, r.loadEnd()*bs
		if f.Valid%bs != 0 || f.Valid < from || f.Valid >= end {
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, want a block boundary in [%d, %d)", e.label, f.Req, f.Valid, from, end)
		}
		q := e.validEnd(r)
		bound := q * bs
		want := fmt.Sprintf("everything before block %d, the first that a worker reported failed", r.failAt)
		if e.hybrid() {
			want = fmt.Sprintf("the longest prefix every KV cache group can resume from with the request's local blocks and the entries loaded without failure (a worker reported %s failed)", e.failedName(r))
		}
		switch {
		case r.rotated && f.Valid > bound:
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, but a worker reported %s failed: at most %d tokens are valid", e.label, f.Req, f.Valid, e.failedName(r), bound)
		case !r.rotated && q == r.loadEnd():
			e.t.Fatalf("%s: Progress.Failed names %s (valid %d tokens), but every worker loaded every block of it", e.label, f.Req, f.Valid)
		case !r.rotated && f.Valid != bound:
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, want %d: %s", e.label, f.Req, f.Valid, bound, want)
		}
		if want := e.policy == connector.PolicyFail; r.phase != done && f.Fail != want {
			e.t.Fatalf("%s: Progress.Failed: %s Fail = %v under kv_load_failure_policy %q, want %v", e.label, f.Req, f.Fail, e.policy, want)
		}
		// What resuming at Valid uses is checked; the rest is recomputed
		// or freed: nothing may write it now.
		v := f.Valid / bs
		for g := range e.groups {
			for i := r.loadLo[g]; i < r.loadEnd(); i++ {
				b := r.tables[g][i]
				if i < v && i >= e.needFrom(g, 0, v) {
					e.checkBlock("loaded (before the failure)", r, g, i, b)
					continue
				}
				e.poisonBlock(g, b)
				e.blk(g, b).clean, e.blk(g, b).failed = true, true
			}
		}
		e.want.loadFailures += int64(r.loadEnd() - v)
		r.inLoad = false
		progress = true
		e.stats.failedLoads++
		e.w.count.failedLoads++
		e.w.count.failedBlocks += r.loadEnd() - v
		if r.phase == done {
			continue
		}
		// A state the engine will not compute again is no state it keeps:
		// the entries of the states after Valid become NoBlock.
		for g, spec := range e.groups {
			if spec.Kind != hashing.RecurrentState {
				continue
			}
			for i := v; i < len(r.tables[g]); i++ {
				if b := r.tables[g][i]; b != connector.NoBlock {
					e.release(g, b)
					r.tables[g][i] = connector.NoBlock
				}
			}
		}
		r.computed = f.Valid
		r.phase = running
		if f.Fail {
			r.failed = true
		}
	}
	for _, id := range p.Released {
		r := e.kept[id]
		if r == nil {
			e.t.Fatalf("%s: Progress.Released names %s, which keeps no blocks", e.label, id)
		}
		delete(e.kept, id)
		e.freeBlocks(r)
		e.stats.released++
		progress = true
	}
	if src, ok := e.pair.Planner.(connector.EventSource); ok {
		e.events = src.TakeEvents(e.events[:0])
		e.w.checkEvents(e, e.events)
	}
	return progress
}

// failedName names the first entry of r's load some worker reported
// failed, for messages.
func (e *engine) failedName(r *freq) string {
	for g := range e.groups {
		for i := r.loadLo[g]; i < r.loadEnd(); i++ {
			if r.failures[entry{g, i}] {
				return e.entryName(g, i)
			}
		}
	}
	return fmt.Sprintf("block %d", r.failAt)
}

func (e *engine) find(id connector.RequestID) *freq {
	for _, r := range e.reqs {
		if r.conn.ID == id {
			return r
		}
	}
	return e.kept[id]
}

// finish ends r in the connector, as finished or (with preempted)
// preempted, and frees its blocks, now or on release. r is no longer
// among e.reqs.
func (e *engine) finish(r *freq, preempted bool) {
	e.t.Helper()
	var keep bool
	var err error
	if p, ok := e.pair.Planner.(connector.Preempter); ok && preempted {
		keep, err = p.Preempt(&r.conn, r.tables...)
	} else {
		keep, err = e.pair.Planner.Finish(&r.conn, r.tables...)
	}
	if err != nil {
		e.t.Fatalf("%s: Finish(%s): %v", e.label, r.conn.ID, err)
	}
	if !preempted {
		e.stats.finished++
	}
	if r.inLoad && !keep {
		e.t.Fatalf("%s: Finish(%s) = keep false while its load runs", e.label, r.conn.ID)
	}
	if !keep && slices.ContainsFunc(slices.Collect(maps.Values(e.xfers)), func(x *xfer) bool { return x.req == r.conn.ID && x.n > 0 }) {
		e.t.Fatalf("%s: Finish(%s) = keep false while a transfer of its blocks is unfinished", e.label, r.conn.ID)
	}
	r.phase = done
	if !preempted && !r.failed && r.gen == e.id.Generation && len(e.history) < 16 {
		e.history = append(e.history, slices.Clone(r.tokens[:r.conn.Prompt]))
	}
	if keep {
		e.kept[r.conn.ID] = r
		if src, ok := e.pair.Planner.(connector.TransferParamsSource); ok && !preempted && !r.failed && r.computed == len(r.tokens) {
			if p, err := src.TransferParams(r.conn.ID); err == nil {
				e.offers = append(e.offers, offer{prompt: slices.Clone(r.tokens[:r.conn.Prompt]), params: p})
			}
		}
		return
	}
	e.freeBlocks(r)
}

// freeBlocks frees r's blocks: those of full blocks it computed or loaded
// go to the local prefix cache, the rest are poisoned.
func (e *engine) freeBlocks(r *freq) {
	e.t.Helper()
	valid := r.computed / e.id.Layout.BlockSize
	if r.gen != e.id.Generation || r.inLoad {
		valid = 0 // computed under older weights: never cached
	}
	for g, table := range r.tables {
		for i, b := range table {
			if b == connector.NoBlock {
				continue
			}
			if i < valid && i < len(r.conn.Hashes) {
				e.retire(g, b, r.conn.Hashes[i], true)
				continue
			}
			e.release(g, b)
		}
	}
	r.tables = nil
}

// preempt ends a running or loading request and queues it again from
// scratch under a new ID, with the parameters it arrived with: a
// connector must cope with parameters whose offer has since been
// withdrawn.
func (e *engine) preempt(r *freq) {
	e.t.Helper()
	prompt := r.tokens[:r.conn.Prompt]
	decode := r.decode + len(r.tokens) - r.conn.Prompt
	e.reqs = slices.DeleteFunc(e.reqs, func(q *freq) bool { return q == r })
	e.stats.preempted++
	e.w.count.preemptions++
	if r.matched {
		e.finish(r, true)
	} else {
		e.freeBlocks(r)
	}
	e.addWith(prompt, decode, r.conn.TransferParams)
}

// rotate moves to the next weights generation.
func (e *engine) rotate(rot connector.Rotator) {
	e.t.Helper()
	gen := e.id.Generation + 1
	if err := rot.Rotate(gen); err != nil {
		e.t.Fatalf("%s: Rotate(%d): %v", e.label, gen, err)
	}
	e.w.count.rotations++
	// Every block computed under the old weights is stale: drop the local
	// cache and restart every request.
	for _, r := range slices.Clone(e.reqs) {
		e.preempt(r)
	}
	for _, r := range e.kept {
		r.rotated = true
	}
	e.id.Generation = gen
	e.history = e.history[:0]
	e.dropCache()
	for _, r := range e.reqs {
		r.gen = gen // queued again from scratch: computed under the new weights
	}
	ns, err := e.id.Namespace()
	if err != nil {
		e.t.Fatalf("Namespace: %v", err)
	}
	e.ns = ns
	e.gens[gen] = ns
	e.w.rec.layout(ns)
}

// busy reports whether requests, kept blocks or unfinished transfers
// remain.
func (e *engine) busy() bool { return len(e.reqs) > 0 || len(e.kept) > 0 || len(e.xfers) > 0 }

// waits describes the background work the engine waits for, the oldest
// first, and when it began (or since, if later); offers says whether the
// unfinished saves of a producer's offers count (they wait for another
// instance).
func (e *engine) waits(since time.Time, offers bool) (what string, began time.Time) {
	consider := func(w string, t time.Time) {
		t = later(t, since)
		if what == "" || t.Before(began) {
			what, began = w, t
		}
	}
	for _, r := range e.reqs {
		if r.phase == waiting && !r.pendingSince.IsZero() {
			consider(fmt.Sprintf("%s: Match(%s) to stop answering Pending", e.label, r.conn.ID), r.pendingSince)
		}
	}
	for _, x := range e.xfers {
		if !x.load && !offers && e.isOffer(x) {
			continue
		}
		var ranks []int
		for rank, l := range x.left {
			if l {
				ranks = append(ranks, rank)
			}
		}
		kind := "save"
		if x.load {
			kind = "load"
		}
		consider(fmt.Sprintf("%s: workers %v to report %s transfer %d (request %s, %d blocks) done", e.label, ranks, kind, x.id, x.req, x.n), x.since)
	}
	return what, began
}

// stuck says what the engine waits for when nothing is in flight.
func (e *engine) stuck() []string {
	var why []string
	for _, r := range e.reqs {
		if r.inLoad && len(r.loads) == 0 {
			why = append(why, fmt.Sprintf("%s: Progress never listed %s loaded or failed, though every worker reported its load", e.label, r.conn.ID))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(e.kept)) {
		if !slices.ContainsFunc(slices.Collect(maps.Values(e.xfers)), func(x *xfer) bool { return x.req == id }) {
			why = append(why, fmt.Sprintf("%s: the connector keeps the blocks of %s, which no unfinished transfer touches, and never releases them", e.label, id))
		}
	}
	if len(why) == 0 {
		why = append(why, fmt.Sprintf("%s: the engine waits for something the connector never does", e.label))
	}
	return why
}

// isOffer reports whether x is a producer's offer: a save of a request
// that ended, whose blocks its connector keeps for another instance.
func (e *engine) isOffer(x *xfer) bool {
	_, ok := e.pair.Planner.(connector.TransferParamsSource)
	return ok && !x.load && e.kept[x.req] != nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// checkStats compares the connector's Stats, where its halves report
// them, with what the engine saw: the scheduler half's hits and
// discarded blocks, each worker's loaded, failed and corrupt blocks.
func (e *engine) checkStats() {
	e.t.Helper()
	if sr, ok := e.pair.Planner.(connector.StatsReporter); ok {
		st := sr.Stats()
		for _, c := range []struct {
			name      string
			got, want int64
			what      string
		}{
			{"HitBlocks", st.HitBlocks, e.want.hitBlocks, "blocks the engine allocated for external tokens"},
			{"HitTokens", st.HitTokens, e.want.hitTokens, "external tokens the engine allocated blocks for"},
			{"LoadFailures", st.LoadFailures, e.want.loadFailures, "blocks from the Valid of each Progress.Failed to the end of its load"},
		} {
			if c.got != c.want {
				e.t.Fatalf("%s: the scheduler half's Stats().%s = %d, want %d: the %s", e.label, c.name, c.got, c.want, c.what)
			}
		}
	}
	for rank, w := range e.pair.Workers {
		sr, ok := w.(connector.StatsReporter)
		if !ok {
			continue
		}
		st := sr.Stats()
		for _, c := range []struct {
			name      string
			got, want int64
			what      string
		}{
			{"Loads", st.Loads, e.want.loads[rank], "blocks of its load transfers it reported done and not failed"},
			{"LoadFailures", st.LoadFailures, e.want.workerLoadFailures[rank], "blocks of its load transfers it reported failed, not as stale"},
		} {
			if c.got != c.want {
				e.t.Fatalf("%s: worker %d's Stats().%s = %d, want %d: the %s", e.label, rank, c.name, c.got, c.want, c.what)
			}
		}
		// Corrupt counts blocks whose bytes failed verification: at most
		// the blocks reported failed with ReasonCorrupt, which also name
		// the rest of a load that fails from a corrupt block on, and the
		// blocks of transfer parameters refused before any byte was read.
		if st.Corrupt < 0 || st.Corrupt > e.want.corrupt[rank] {
			e.t.Fatalf("%s: worker %d's Stats().Corrupt = %d, want 0 to %d: the blocks it reported failed with ReasonCorrupt", e.label, rank, st.Corrupt, e.want.corrupt[rank])
		}
		// A worker that failed blocks as corrupt counted at least one of
		// them, or the transfer parameters it refused.
		if e.want.corrupt[rank] > 0 && st.Corrupt == 0 && st.Refused == 0 {
			e.t.Fatalf("%s: worker %d reported %d blocks failed with ReasonCorrupt, but its Stats().Corrupt and Stats().Refused are 0: it counts the blocks whose bytes failed verification in Corrupt, and refused transfer parameters in Refused", e.label, rank, e.want.corrupt[rank])
		}
	}
}

// close closes each half twice (the second Close must return nil) and
// frees the KV memory. Checks are made only when check is set.
func (e *engine) close(check bool) {
	e.t.Helper()
	if e.closed {
		return
	}
	e.closed = true
	closeTwice := func(what string, c interface{ Close() error }) {
		if c == nil {
			return
		}
		err := c.Close()
		if !check {
			return
		}
		if err != nil {
			e.t.Fatalf("%s: %s: Close: %v", e.label, what, err)
		}
		if err := c.Close(); err != nil {
			e.t.Fatalf("%s: %s: a second Close returned %v, want nil: Close is idempotent", e.label, what, err)
		}
	}
	for rank, w := range e.pair.Workers {
		closeTwice(fmt.Sprintf("worker %d", rank), w)
	}
	if e.pair.Planner != nil {
		closeTwice("scheduler half", e.pair.Planner)
	}
	if e.pair.Close != nil {
		if err := e.pair.Close(); err != nil && check {
			e.t.Fatalf("%s: Pair.Close: %v", e.label, err)
		}
	}
	e.w.rec.unmapMemory(e)
	for _, m := range e.mem {
		if err := m.Free(); err != nil && check {
			e.t.Fatalf("%s: free KV memory: %v", e.label, err)
		}
	}
}

// describe summarizes the engine's requests, for failure messages.
func (e *engine) describe() string {
	s := fmt.Sprintf("%s: %d free blocks, %d cached;", e.label, len(e.pools[0].free), e.cached())
	for _, r := range e.reqs {
		s += fmt.Sprintf(" [%s %v, %d/%d tokens computed, %d blocks, decode %d, in load %v]",
			r.conn.ID, r.phase, r.computed, len(r.tokens), len(r.tables0()), r.decode, r.inLoad)
	}
	for _, id := range slices.Sorted(maps.Keys(e.kept)) {
		s += fmt.Sprintf(" [%s kept]", id)
	}
	for _, id := range slices.Sorted(maps.Keys(e.xfers)) {
		x := e.xfers[id]
		s += fmt.Sprintf(" [transfer %d of %s unreported by %d workers]", id, x.req, x.nleft)
	}
	return s
}

// pause sleeps between looks at a condition, from 20µs up to 2ms.
type pause struct {
	d     time.Duration
	probe time.Duration // how long to wait for a wake-up before a step looks for news
}

func (p *pause) sleep() {
	p.d = min(max(2*p.d, 20*time.Microsecond), 2*time.Millisecond)
	time.Sleep(p.d)
}

func (p *pause) reset() { p.d, p.probe = 0, 0 }
