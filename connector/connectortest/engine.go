package connectortest

import (
	"bytes"
	"context"
	"encoding/binary"
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

// freq is one request of the model engine.
type freq struct {
	conn     connector.Request
	tokens   []hashing.Token
	chain    *hashing.Chain
	blocks   []connector.BlockID
	computed int // tokens whose KV is in blocks
	decode   int // tokens still to generate
	phase    phase
	admitted uint64 // admission order: the youngest is preempted first
	gen      uint64 // the generation its KV is computed in
	matched  bool   // the connector has seen it
	failed   bool   // its load failed under policy fail

	// Its load: blocks [loadFrom, loadFrom+loadN) of the chain.
	inLoad   bool
	loadFrom int
	loadN    int
	loads    []uint64 // its load transfers some worker has not reported done
	failAt   int      // lowest chain index of a block some worker failed to load; -1 if none
	rotated  bool     // the generation changed while its load ran

	pendingSince time.Time // when Match began to answer Pending; zero if it does not
}

// block is the engine's record of one KV block.
type block struct {
	owner  *freq
	cached bool              // in the local prefix cache
	hash   hashing.BlockHash // valid when cached
	lru    uint64            // last use, for cached blocks
	clean  bool              // holds poison, and nothing may write it
	failed bool              // clean because its load was reported failed
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
	id    uint64
	load  bool
	req   connector.RequestID
	first int
	n     int
	left  []bool   // per rank: not yet reported done
	nleft int      // ranks not yet reported done
	fails [][]bool // per rank, per block: reported failed
	since time.Time
}

// engine is a model of an inference engine with paged KV memory: a local
// prefix cache, requests that share prefixes, chunked prefill, decode,
// preemption, and KV bytes that are a known function of the namespace
// (tenant, model, generation, layout...), the shard and the block hash, so
// that any block the connector loads can be checked byte for byte.
type engine struct {
	w        *world
	t        tb
	label    string // names its requests
	id       hashing.Identity
	ns       hashing.Namespace
	gens     map[uint64]hashing.Namespace // every generation it ran
	pair     Pair
	policy   connector.Policy
	waiter   bool // its ready events implement connector.Waiter
	kv       []connector.KVCache
	mem      []*rdma.HostMemory
	blocks   []block
	free     []connector.BlockID
	reqs     []*freq // admitted or waiting, in arrival order
	kept     map[connector.RequestID]*freq
	cache    map[hashing.BlockHash]connector.BlockID
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

func newEngine(w *world, label string, id hashing.Identity, pair Pair, policy connector.Policy, order connector.Order, nblocks int, waiter bool) (*engine, error) {
	ns, err := id.Namespace()
	if err != nil {
		return nil, err
	}
	tp := id.Layout.TPSize
	e := &engine{
		w:      w,
		t:      w.t,
		label:  label,
		id:     id,
		ns:     ns,
		gens:   map[uint64]hashing.Namespace{id.Generation: ns},
		pair:   pair,
		policy: policy,
		waiter: waiter,
		blocks: make([]block, nblocks),
		kept:   make(map[connector.RequestID]*freq),
		cache:  make(map[hashing.BlockHash]connector.BlockID),
		xfers:  make(map[uint64]*xfer),
		want: wantStats{
			loads:              make([]int64, tp),
			workerLoadFailures: make([]int64, tp),
			corrupt:            make([]int64, tp),
		},
	}
	for rank := range pair.Workers {
		kv := connector.KVCache{Layers: id.Layout.Layers, Blocks: nblocks, KV: 2, BlockBytes: 64, Order: order}
		m, err := rdma.AllocHost(kv.Layers * kv.KV * kv.Blocks * kv.BlockBytes)
		if err != nil {
			return e, err
		}
		e.mem = append(e.mem, m)
		fill(m.Bytes(), poison)
		kv.Regions = []rdma.Region{m.Region()}
		if err := pair.Workers[rank].Register(kv); err != nil {
			return e, fmt.Errorf("worker %d: Register: %w", rank, err)
		}
		e.kv = append(e.kv, kv)
	}
	for b := nblocks - 1; b >= 0; b-- {
		e.free = append(e.free, connector.BlockID(b))
		e.blocks[b].clean = true
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

// content writes into dst the KV bytes of block h in shard shard of
// namespace ns: what a model would compute. Every field of the identity
// (through the namespace digest), the shard and the hash change them.
func content(dst []byte, ns hashing.Namespace, shard int, h hashing.BlockHash) {
	d := ns.Digest()
	seed := binary.LittleEndian.Uint64(h[:8]) ^ binary.LittleEndian.Uint64(h[8:16])*0x94d049bb133111eb ^
		binary.LittleEndian.Uint64(d[:8]) ^ uint64(shard+1)*0xbf58476d1ce4e5b9
	for i := 0; i+8 <= len(dst); i += 8 {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
}

// blockBytes gathers block b of worker rank, in store order.
func (e *engine) blockBytes(rank int, b connector.BlockID) []byte {
	var dst []byte
	for _, sp := range e.kv[rank].Spans(nil, b) {
		dst = append(dst, sp.Bytes()...)
	}
	return dst
}

// put scatters src (store order) into block b of worker rank.
func (e *engine) put(rank int, b connector.BlockID, src []byte) {
	for _, sp := range e.kv[rank].Spans(nil, b) {
		n := copy(sp.Bytes(), src)
		src = src[n:]
	}
}

// poisonBlock fills block b with poison in every worker.
func (e *engine) poisonBlock(b connector.BlockID) {
	for rank := range e.mem {
		for _, sp := range e.kv[rank].Spans(nil, b) {
			fill(sp.Bytes(), poison)
		}
	}
}

// expectPoison fails the test unless block b holds poison in every
// worker; what says which block it is, for the message.
func (e *engine) expectPoison(b connector.BlockID, what string) {
	e.t.Helper()
	for rank := range e.mem {
		if got := e.blockBytes(rank, b); !all(got, poison) {
			why := "which nothing may write"
			switch {
			case e.blocks[b].failed:
				why = "after its load was reported failed"
			case e.blocks[b].owner == nil:
				why = "after the engine freed it"
			}
			e.t.Fatalf("%s: engine block %d (%s), rank %d, was written %s%s", e.label, b, what, rank, why, e.explain(got, rank, nil))
		}
	}
}

// checkBlock fails the test unless block b holds, in every worker, the KV
// of chain block i of r in the current generation.
func (e *engine) checkBlock(what string, r *freq, i int, b connector.BlockID) {
	e.t.Helper()
	h := r.conn.Hashes[i]
	for rank := range e.kv {
		want := make([]byte, e.kv[rank].BlockSize())
		content(want, e.ns, e.ns.Shard(rank), h)
		if got := e.blockBytes(rank, b); !bytes.Equal(got, want) {
			e.t.Fatalf("%s, request %s: %s block %d (engine block %d), rank %d: bytes differ from the KV saved for its key (generation %d)%s",
				e.label, r.conn.ID, what, i, b, rank, e.id.Generation, e.explain(got, rank, &h))
		}
	}
}

// explain says what the bytes of a block are, when they are not what they
// should be: poison, another namespace's or shard's KV, an unfinished
// write.
func (e *engine) explain(got []byte, rank int, h *hashing.BlockHash) string {
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
	for _, o := range e.w.engines {
		for gen, ns := range o.gens {
			for shard := range ns.Shards() {
				content(want, ns, shard, *h)
				if !bytes.Equal(got, want) {
					continue
				}
				switch {
				case o == e && gen != e.id.Generation:
					return fmt.Sprintf(": it holds the block's KV of generation %d of this identity, shard %d: a stale generation", gen, shard)
				case ns == e.ns:
					return fmt.Sprintf(": it holds the block's KV of shard %d, not of rank %d's shard %d", shard, rank, e.ns.Shard(rank))
				default:
					return fmt.Sprintf(": it holds the block's KV of %s's identity (%s, generation %d), shard %d: KV crossed identities", o.label, ns, gen, shard)
				}
			}
		}
	}
	return ": the bytes are no KV the harness knows (a torn, scribbled or misplaced read)"
}

// alloc takes a free block, evicting the least recently used cached block
// when none is free. It checks that nothing wrote the block since it was
// freed.
func (e *engine) alloc(r *freq) (connector.BlockID, bool) {
	e.t.Helper()
	if len(e.free) == 0 && !e.evictOne() {
		return 0, false
	}
	b := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	e.expectPoison(b, "free")
	e.blocks[b] = block{owner: r, clean: true}
	return b, true
}

// release returns a block to the free list, poisoned. A block that was to
// hold poison is checked first.
func (e *engine) release(b connector.BlockID) {
	e.t.Helper()
	if e.blocks[b].clean {
		what := "never computed"
		if o := e.blocks[b].owner; o != nil {
			what = fmt.Sprintf("of request %s, never computed", o.conn.ID)
		}
		e.expectPoison(b, what)
	}
	e.poisonBlock(b)
	e.blocks[b] = block{clean: true}
	e.free = append(e.free, b)
}

func (e *engine) evictOne() bool {
	e.t.Helper()
	var victim connector.BlockID = -1
	for _, b := range e.cache {
		if victim < 0 || e.blocks[b].lru < e.blocks[victim].lru || e.blocks[b].lru == e.blocks[victim].lru && b < victim {
			victim = b
		}
	}
	if victim < 0 {
		return false
	}
	delete(e.cache, e.blocks[victim].hash)
	e.release(victim)
	return true
}

// dropCache empties the local prefix cache.
func (e *engine) dropCache() {
	e.t.Helper()
	for _, b := range slices.Sorted(maps.Values(e.cache)) {
		delete(e.cache, e.blocks[b].hash)
		e.release(b)
	}
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
	r := &freq{tokens: slices.Clone(prompt), chain: chain, decode: decode, gen: e.id.Generation, failAt: -1}
	r.conn.ID = connector.RequestID(fmt.Sprintf("%s-r%d", e.label, e.nextReq))
	r.conn.Prompt = len(prompt)
	r.conn.TransferParams = params
	chain.Append(nil, prompt...)
	r.conn.Hashes = chain.Hashes()
	e.reqs = append(e.reqs, r)
}

// admit tries to start a waiting request: local prefix hit, external match
// beyond it, allocation of its prompt's blocks, Allocated. It reports
// whether the request was admitted.
func (e *engine) admit(r *freq) bool {
	e.t.Helper()
	bs := e.id.Layout.BlockSize
	hashes := r.conn.Hashes
	// Local prefix hit, never the last prompt token.
	limit := (len(r.tokens) - 1) / bs
	local := 0
	for local < limit {
		if _, ok := e.cache[hashes[local]]; !ok {
			break
		}
		local++
	}
	r.matched = true
	m, err := e.pair.Scheduler.Match(&r.conn, local*bs)
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
	e.w.checkMatch(e, r, local, n)
	nb := (len(r.tokens) + bs - 1) / bs
	if len(e.free)+len(e.cache)-local < nb-local {
		return false // no room yet
	}
	r.blocks = r.blocks[:0]
	for i := range local {
		b := e.cache[hashes[i]]
		delete(e.cache, hashes[i])
		e.checkBlock("locally cached", r, i, b)
		e.blocks[b] = block{owner: r}
		r.blocks = append(r.blocks, b)
	}
	for len(r.blocks) < nb {
		b, ok := e.alloc(r)
		if !ok {
			e.t.Fatalf("%s: out of blocks after checking room", e.label)
		}
		r.blocks = append(r.blocks, b)
	}
	if err := e.pair.Scheduler.Allocated(&r.conn, m.Tokens, r.blocks); err != nil {
		e.t.Fatalf("Allocated(%s, %d blocks, %d): %v", r.conn.ID, len(r.blocks), m.Tokens, err)
	}
	e.admits++
	r.admitted = e.admits
	r.computed = local * bs
	e.stats.localHits += local
	if n > 0 {
		r.phase = loading
		r.inLoad = true
		r.loadFrom, r.loadN = local, n
		r.failAt = -1
		for i := local; i < local+n; i++ {
			e.blocks[r.blocks[i]].clean = false // the load writes it
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

// grow gives r one more block. When none is free it preempts the youngest
// admitted request, r itself when r is the youngest, so that the oldest
// always progresses; it reports whether r got the block.
func (e *engine) grow(r *freq) bool {
	e.t.Helper()
	for {
		if b, ok := e.alloc(r); ok {
			r.blocks = append(r.blocks, b)
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
		if need := (len(r.tokens) + bs) / bs; need > len(r.blocks) {
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
		r.decode--
	}
	for _, r := range slices.Clone(e.reqs) {
		if r.phase == waiting && e.admit(r) {
			progress = true
		}
	}
	// The step's compute: the blocks each request completes.
	type fresh struct {
		r *freq
		i int
	}
	var computed []fresh
	for _, r := range e.reqs {
		if r.phase != running || r.computed == len(r.tokens) {
			continue
		}
		to := len(r.tokens)
		if chunk > 0 && to-r.computed > chunk {
			to = r.computed + chunk
		}
		if err := e.pair.Scheduler.Scheduled(&r.conn, to, r.blocks); err != nil {
			e.t.Fatalf("Scheduled(%s, %d): %v", r.conn.ID, to, err)
		}
		for i := r.computed / bs; i < to/bs; i++ {
			computed = append(computed, fresh{r, i})
		}
		r.computed = to
		progress = true
	}
	meta := e.pair.Scheduler.Plan()
	e.checkPlan(meta)
	// While the step computes, its blocks are unready: a save must not
	// read them until the worker's ready event fires.
	var unready []span
	for _, c := range computed {
		b := c.r.blocks[c.i]
		for rank := range e.kv {
			for _, sp := range e.kv[rank].Spans(nil, b) {
				unready = append(unready, span{sp.Addr, sp.End(), fmt.Sprintf("%s's engine block %d (block %d of request %s, rank %d)", e.label, b, c.i, c.r.conn.ID, rank)})
			}
		}
	}
	e.w.rec.setUnready(unready)
	events := make([]*event, len(e.pair.Workers))
	for rank, w := range e.pair.Workers {
		events[rank] = newEvent()
		if err := w.Start(ctx, meta); err != nil {
			e.t.Fatalf("%s: worker %d: Start: %v", e.label, rank, err)
		}
	}
	// The first half of each block, and garbage in the rest.
	for _, c := range computed {
		b := c.r.blocks[c.i]
		if e.blocks[b].clean {
			e.expectPoison(b, fmt.Sprintf("block %d of request %s, about to be computed", c.i, c.r.conn.ID))
		}
		e.blocks[b].clean, e.blocks[b].failed = false, false
		for rank := range e.kv {
			buf := make([]byte, e.kv[rank].BlockSize())
			content(buf, e.ns, e.ns.Shard(rank), c.r.conn.Hashes[c.i])
			fill(buf[len(buf)/2:], unfinished)
			e.put(rank, b, buf)
		}
	}
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
		blocks := make(map[connector.BlockID]bool)
		for _, c := range computed {
			blocks[c.r.blocks[c.i]] = true
		}
		e.awaitSaves(meta, blocks, events)
	}
	for _, c := range computed {
		for rank := range e.kv {
			buf := make([]byte, e.kv[rank].BlockSize())
			content(buf, e.ns, e.ns.Shard(rank), c.r.conn.Hashes[c.i])
			e.put(rank, c.r.blocks[c.i], buf)
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
	// Requests that are complete end.
	for _, r := range slices.Clone(e.reqs) {
		if r.failed || r.phase == running && r.computed == len(r.tokens) && r.decode == 0 {
			e.reqs = slices.DeleteFunc(e.reqs, func(q *freq) bool { return q == r })
			e.finish(r, false)
			progress = true
		}
	}
	return progress
}

// awaitSaves waits, with the step's KV unfinished, until every worker with
// a save of a block the step computes either looked at its ready event
// (Query or Wait) or reported those saves done: a worker that saves
// without waiting for the event has then read the unfinished blocks.
func (e *engine) awaitSaves(meta *connector.Metadata, computed map[connector.BlockID]bool, events []*event) {
	e.t.Helper()
	var ids []uint64
	for _, t := range meta.Saves {
		if slices.ContainsFunc(t.Blocks, func(b connector.BlockID) bool { return computed[b] }) {
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

// checkPlan checks a step's Metadata and tracks its transfers: each names
// its request's own blocks and hashes; a load only blocks that Allocated
// asked for, a save only computed ones.
func (e *engine) checkPlan(m *connector.Metadata) {
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
			tp := len(e.pair.Workers)
			x := &xfer{id: t.ID, load: list.load, req: t.Req, first: t.First, n: len(t.Blocks), left: make([]bool, tp), nleft: tp, fails: make([][]bool, tp), since: time.Now()}
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
					if j < 0 || j >= len(r.blocks) || j >= len(r.conn.Hashes) || r.blocks[j] != b || r.conn.Hashes[j] != t.Hashes[i] {
						e.t.Fatalf("%s: Plan's %s transfer %d names engine block %d as block %d of request %s, which is not that block or not its hash", e.label, kind, t.ID, b, j, t.Req)
					}
				}
				if list.load {
					if !r.inLoad || t.First < r.loadFrom || t.First+len(t.Blocks) > r.loadFrom+r.loadN {
						e.t.Fatalf("%s: Plan loads blocks [%d, %d) of request %s, which asked for [%d, %d) (in load: %v)", e.label, t.First, t.First+len(t.Blocks), t.Req, r.loadFrom, r.loadFrom+r.loadN, r.inLoad)
					}
					r.loads = append(r.loads, t.ID)
				} else if t.First+len(t.Blocks) > r.computed/bs {
					e.t.Fatalf("%s: Plan saves blocks [%d, %d) of request %s, which has computed %d tokens (%d full blocks)", e.label, t.First, t.First+len(t.Blocks), t.Req, r.computed, r.computed/bs)
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
		if f.Reason != connector.ReasonStale {
			e.want.workerLoadFailures[rank]++
		}
		if f.Reason == connector.ReasonCorrupt {
			e.want.corrupt[rank]++
		}
		if r := e.find(x.req); r != nil && (r.failAt < 0 || x.first+f.Index < r.failAt) {
			r.failAt = x.first + f.Index
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
	p, err := e.pair.Scheduler.Update(e.outs)
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
			e.t.Fatalf("%s: Progress.Loaded names %s, but a worker reported block %d of its load failed", e.label, id, r.failAt)
		}
		r.inLoad = false
		progress = true
		e.w.count.loads++
		e.w.count.loadedBlocks += r.loadN
		if r.phase == done {
			if r.gen == e.id.Generation {
				for i := r.loadFrom; i < r.loadFrom+r.loadN; i++ {
					e.checkBlock("loaded", r, i, r.blocks[i])
				}
			}
			continue
		}
		for i := r.loadFrom; i < r.loadFrom+r.loadN; i++ {
			e.checkBlock("loaded", r, i, r.blocks[i])
		}
		e.stats.loads++
		r.computed = (r.loadFrom + r.loadN) * bs
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
		from, end := r.loadFrom*bs, (r.loadFrom+r.loadN)*bs
		if f.Valid%bs != 0 || f.Valid < from || f.Valid >= end {
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, want a block boundary in [%d, %d)", e.label, f.Req, f.Valid, from, end)
		}
		bound := end
		if r.failAt >= 0 {
			bound = r.failAt * bs
		}
		switch {
		case r.rotated && f.Valid > bound:
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, but a worker reported block %d failed (tokens from %d)", e.label, f.Req, f.Valid, r.failAt, bound)
		case !r.rotated && r.failAt < 0:
			e.t.Fatalf("%s: Progress.Failed names %s (valid %d tokens), but every worker loaded every block of it", e.label, f.Req, f.Valid)
		case !r.rotated && f.Valid != bound:
			e.t.Fatalf("%s: Progress.Failed: %s valid = %d tokens, want %d: everything before block %d, the first that a worker reported failed", e.label, f.Req, f.Valid, bound, r.failAt)
		}
		if want := e.policy == connector.PolicyFail; r.phase != done && f.Fail != want {
			e.t.Fatalf("%s: Progress.Failed: %s Fail = %v under kv_load_failure_policy %q, want %v", e.label, f.Req, f.Fail, e.policy, want)
		}
		for i := r.loadFrom; i < f.Valid/bs; i++ {
			e.checkBlock("loaded (before the failure)", r, i, r.blocks[i])
		}
		// The rest is recomputed or freed: nothing may write it now.
		for i := f.Valid / bs; i < r.loadFrom+r.loadN; i++ {
			b := r.blocks[i]
			e.poisonBlock(b)
			e.blocks[b].clean, e.blocks[b].failed = true, true
		}
		e.want.loadFailures += int64(r.loadFrom + r.loadN - f.Valid/bs)
		r.inLoad = false
		progress = true
		e.stats.failedLoads++
		e.w.count.failedLoads++
		e.w.count.failedBlocks += r.loadFrom + r.loadN - f.Valid/bs
		if r.phase == done {
			continue
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
	if src, ok := e.pair.Scheduler.(connector.EventSource); ok {
		e.events = src.TakeEvents(e.events[:0])
		e.w.checkEvents(e, e.events)
	}
	return progress
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
	if p, ok := e.pair.Scheduler.(connector.Preempter); ok && preempted {
		keep, err = p.Preempt(&r.conn, r.blocks)
	} else {
		keep, err = e.pair.Scheduler.Finish(&r.conn, r.blocks)
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
		if src, ok := e.pair.Scheduler.(connector.TransferParamsSource); ok && !preempted && !r.failed && r.computed == len(r.tokens) {
			if p, err := src.TransferParams(r.conn.ID); err == nil {
				e.offers = append(e.offers, offer{prompt: slices.Clone(r.tokens[:r.conn.Prompt]), params: p})
			}
		}
		return
	}
	e.freeBlocks(r)
}

// freeBlocks frees r's blocks: full computed blocks go to the local prefix
// cache, the rest are poisoned.
func (e *engine) freeBlocks(r *freq) {
	e.t.Helper()
	bs := e.id.Layout.BlockSize
	valid := r.computed / bs
	if r.gen != e.id.Generation || r.inLoad {
		valid = 0 // computed under older weights: never cached
	}
	for i, b := range r.blocks {
		if i < valid && i < len(r.conn.Hashes) && !e.blocks[b].clean {
			h := r.conn.Hashes[i]
			if _, dup := e.cache[h]; !dup {
				e.clock++
				e.blocks[b] = block{cached: true, hash: h, lru: e.clock}
				e.cache[h] = b
				continue
			}
		}
		e.release(b)
	}
	r.blocks = nil
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
	_, ok := e.pair.Scheduler.(connector.TransferParamsSource)
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
	if sr, ok := e.pair.Scheduler.(connector.StatsReporter); ok {
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
			{"Corrupt", st.Corrupt, e.want.corrupt[rank], "blocks it reported failed with ReasonCorrupt"},
		} {
			if c.got != c.want {
				e.t.Fatalf("%s: worker %d's Stats().%s = %d, want %d: the %s", e.label, rank, c.name, c.got, c.want, c.what)
			}
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
	if e.pair.Scheduler != nil {
		closeTwice("scheduler half", e.pair.Scheduler)
	}
	if e.pair.Close != nil {
		if err := e.pair.Close(); err != nil && check {
			e.t.Fatalf("%s: Pair.Close: %v", e.label, err)
		}
	}
	for _, m := range e.mem {
		if err := m.Free(); err != nil && check {
			e.t.Fatalf("%s: free KV memory: %v", e.label, err)
		}
	}
}

// describe summarizes the engine's requests, for failure messages.
func (e *engine) describe() string {
	s := fmt.Sprintf("%s: %d free blocks, %d cached;", e.label, len(e.free), len(e.cache))
	for _, r := range e.reqs {
		s += fmt.Sprintf(" [%s %v, %d/%d tokens computed, %d blocks, decode %d, in load %v]",
			r.conn.ID, r.phase, r.computed, len(r.tokens), len(r.blocks), r.decode, r.inLoad)
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
type pause struct{ d time.Duration }

func (p *pause) sleep() {
	p.d = min(max(2*p.d, 20*time.Microsecond), 2*time.Millisecond)
	time.Sleep(p.d)
}

func (p *pause) reset() { p.d = 0 }
