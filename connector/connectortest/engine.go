package connectortest

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// poison fills freed blocks, so that a write into a block after the engine
// freed it is seen when the block is handed out again.
const poison = 0xA5

// phase is where a fake request is in its life.
type phase uint8

const (
	waiting phase = iota // not admitted: no blocks
	loading              // blocks allocated, external KV loading
	running              // computing its prompt or decoding
	done                 // finished, blocks kept until released
)

// freq is one request of the fake engine.
type freq struct {
	conn     connector.Request
	tokens   []hashing.Token
	chain    *hashing.Chain
	blocks   []connector.BlockID
	computed int // tokens whose KV is in blocks
	decode   int // tokens still to generate
	phase    phase
	loadFrom int    // first block of the running load
	loadN    int    // blocks of the running load
	pending  int    // steps Match has answered Pending in a row
	local    int    // tokens taken from the local prefix cache at admission
	external int    // tokens loaded from the store
	gen      uint64 // the generation its KV is computed in
	inLoad   bool   // a load is planned or running
	matched  bool   // the connector has seen it
	failed   bool   // its load failed under policy fail
}

// block is the fake engine's record of one KV block.
type block struct {
	owner  *freq
	cached bool              // in the local prefix cache
	hash   hashing.BlockHash // valid when cached
	gen    uint64            // generation its content was computed in (cached)
	lru    uint64            // last use, for cached blocks
}

// event is a ready event that the engine fires once the step's compute has
// written its blocks.
type event struct{ fired atomic.Bool }

func (e *event) Query() (bool, error) { return e.fired.Load(), nil }

// engine is a model of an inference engine with paged KV memory: a local
// prefix cache, requests that share prefixes, and deterministic KV bytes for
// every (tenant, generation, shard, block hash), so that any block the
// connector loads can be checked byte for byte.
type engine struct {
	t       tb
	label   string // names its requests; "t<tenant>" unless set
	tenant  int
	id      hashing.Identity
	ns      hashing.Namespace
	pair    Pair
	kv      []connector.KVCache
	mem     []*rdma.HostMemory
	blocks  []block
	free    []connector.BlockID
	reqs    []*freq // admitted or waiting, in arrival order
	kept    map[connector.RequestID]*freq
	cache   map[hashing.BlockHash]connector.BlockID
	clock   uint64
	nextReq int
	outs    []*connector.Output
	stats   engineStats
	// offers are the prompts this engine finished whose blocks its
	// connector keeps for another instance, with the transfer parameters
	// (connector.TransferParamsSource) to hand on.
	offers []offer
}

type offer struct {
	prompt []hashing.Token
	params []byte
}

type engineStats struct {
	localHits, externalHits, loads, failedLoads, finished int
}

// tb is the part of testing.TB and *rapid.T the engine uses.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

func newEngine(t tb, tenant int, id hashing.Identity, pair Pair, layout connector.Order, nblocks int) (*engine, error) {
	ns, err := id.Namespace()
	if err != nil {
		return nil, err
	}
	e := &engine{
		t:      t,
		tenant: tenant,
		id:     id,
		ns:     ns,
		pair:   pair,
		blocks: make([]block, nblocks),
		kept:   make(map[connector.RequestID]*freq),
		cache:  make(map[hashing.BlockHash]connector.BlockID),
	}
	l := id.Layout
	for rank := range pair.Workers {
		kv := connector.KVCache{Layers: 2, Blocks: nblocks, KV: 2, BlockBytes: 64, Order: layout}
		m, err := rdma.AllocHost(kv.Layers * kv.KV * kv.Blocks * kv.BlockBytes)
		if err != nil {
			return nil, err
		}
		e.mem = append(e.mem, m)
		kv.Regions = []rdma.Region{m.Region()}
		if err := pair.Workers[rank].Register(kv); err != nil {
			return nil, fmt.Errorf("worker %d: Register: %w", rank, err)
		}
		e.kv = append(e.kv, kv)
		fill(m.Bytes(), poison)
	}
	_ = l
	for b := nblocks - 1; b >= 0; b-- {
		e.free = append(e.free, connector.BlockID(b))
	}
	return e, nil
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// content writes into dst the KV bytes that a block with hash h has for this
// engine's tenant, generation gen and shard: what a model would compute.
func (e *engine) content(dst []byte, gen uint64, shard int, h hashing.BlockHash) {
	seed := binary.LittleEndian.Uint64(h[:8]) ^ gen*0x9e3779b97f4a7c15 ^ uint64(shard+1)*0xbf58476d1ce4e5b9 ^ uint64(e.tenant+1)*0x94d049bb133111eb
	for i := 0; i+8 <= len(dst); i += 8 {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
}

// blockBytes gathers block b of worker rank into dst, in store order.
func (e *engine) blockBytes(dst []byte, rank int, b connector.BlockID) []byte {
	dst = dst[:0]
	for _, sp := range e.kv[rank].Spans(nil, b) {
		dst = append(dst, sp.Bytes()...)
	}
	return dst
}

// writeBlock computes block b of worker rank: it writes the expected bytes.
func (e *engine) writeBlock(rank int, b connector.BlockID, h hashing.BlockHash) {
	buf := make([]byte, e.kv[rank].BlockSize())
	e.content(buf, e.id.Generation, e.ns.Shard(rank), h)
	for _, sp := range e.kv[rank].Spans(nil, b) {
		n := copy(sp.Bytes(), buf)
		buf = buf[n:]
	}
}

// checkBlock fails the test unless block b holds, in every worker, the KV
// of hash h in the current generation.
func (e *engine) checkBlock(what string, r *freq, i int, b connector.BlockID, h hashing.BlockHash) {
	e.t.Helper()
	for rank := range e.kv {
		want := make([]byte, e.kv[rank].BlockSize())
		e.content(want, e.id.Generation, e.ns.Shard(rank), h)
		got := e.blockBytes(nil, rank, b)
		if !slices.Equal(got, want) {
			e.t.Fatalf("tenant %d, request %s: %s block %d (engine block %d), rank %d: bytes differ from the KV saved for its key (generation %d)%s",
				e.tenant, r.conn.ID, what, i, b, rank, e.id.Generation, describe(got))
		}
	}
}

func describe(got []byte) string {
	for _, c := range got {
		if c != poison {
			return ""
		}
	}
	return ": the block was never written (still poisoned)"
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
	for rank := range e.mem {
		for _, sp := range e.kv[rank].Spans(nil, b) {
			for _, c := range sp.Bytes() {
				if c != poison {
					e.t.Fatalf("tenant %d: engine block %d was written after the engine freed it (rank %d)", e.tenant, b, rank)
				}
			}
		}
	}
	e.blocks[b] = block{owner: r}
	return b, true
}

// release returns a block to the free list, poisoned.
func (e *engine) release(b connector.BlockID) {
	for rank := range e.mem {
		for _, sp := range e.kv[rank].Spans(nil, b) {
			fill(sp.Bytes(), poison)
		}
	}
	e.blocks[b] = block{}
	e.free = append(e.free, b)
}

func (e *engine) evictOne() bool {
	var victim connector.BlockID = -1
	for h, b := range e.cache {
		if victim < 0 || e.blocks[b].lru < e.blocks[victim].lru || e.blocks[b].lru == e.blocks[victim].lru && b < victim {
			victim = b
		}
		_ = h
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
	for h, b := range e.cache {
		delete(e.cache, h)
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
	chain, err := hashing.NewChain(e.id.Layout.BlockSize)
	if err != nil {
		e.t.Fatalf("NewChain: %v", err)
	}
	r := &freq{tokens: slices.Clone(prompt), chain: chain, decode: decode, gen: e.id.Generation}
	label := e.label
	if label == "" {
		label = fmt.Sprintf("t%d", e.tenant)
	}
	r.conn.ID = connector.RequestID(fmt.Sprintf("%s-r%d", label, e.nextReq))
	r.conn.Prompt = len(prompt)
	r.conn.TransferParams = params
	chain.Append(nil, prompt...)
	r.conn.Hashes = chain.Hashes()
	e.reqs = append(e.reqs, r)
}

// admit tries to start a waiting request: local prefix hit, external match
// beyond it, allocation of its prompt's blocks, Allocated.
func (e *engine) admit(r *freq) {
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
		r.pending++
		if r.pending > 10000 {
			e.t.Fatalf("Match(%s) answered Pending %d times in a row", r.conn.ID, r.pending)
		}
		return
	}
	r.pending = 0
	if m.Tokens < 0 || m.Tokens%bs != 0 {
		e.t.Fatalf("Match(%s) = %d tokens, not a whole number of %d-token blocks", r.conn.ID, m.Tokens, bs)
	}
	if local*bs+m.Tokens >= len(r.tokens) {
		e.t.Fatalf("Match(%s) = %d tokens beyond %d: covers the last prompt token of a %d-token prompt", r.conn.ID, m.Tokens, local*bs, len(r.tokens))
	}
	nb := (len(r.tokens) + bs - 1) / bs
	if len(e.free)+len(e.cache)-local < nb-local {
		return // no room yet
	}
	r.blocks = r.blocks[:0]
	for i := 0; i < local; i++ {
		b := e.cache[hashes[i]]
		delete(e.cache, hashes[i])
		e.checkBlock("locally cached", r, i, b, hashes[i])
		e.blocks[b] = block{owner: r}
		r.blocks = append(r.blocks, b)
	}
	for len(r.blocks) < nb {
		b, ok := e.alloc(r)
		if !ok {
			e.t.Fatalf("tenant %d: out of blocks after checking room", e.tenant)
		}
		r.blocks = append(r.blocks, b)
	}
	if err := e.pair.Scheduler.Allocated(&r.conn, r.blocks, m.Tokens); err != nil {
		e.t.Fatalf("Allocated(%s, %d blocks, %d): %v", r.conn.ID, len(r.blocks), m.Tokens, err)
	}
	r.local = local * bs
	r.computed = local * bs
	e.stats.localHits += local
	if m.Tokens > 0 {
		r.phase = loading
		r.inLoad = true
		r.loadFrom, r.loadN = local, m.Tokens/bs
		r.external = m.Tokens
		e.stats.externalHits += m.Tokens / bs
	} else {
		r.phase = running
	}
}

// step runs one engine step; chunk limits the prompt tokens a request
// computes in it (0: no limit).
func (e *engine) step(ctx context.Context, chunk int) {
	e.t.Helper()
	bs := e.id.Layout.BlockSize
	type work struct {
		r        *freq
		from, to int
	}
	var computed []work
	var victims []*freq
	for _, r := range e.reqs {
		switch r.phase {
		case waiting:
			e.admit(r)
		case running:
			if r.computed == len(r.tokens) {
				if r.decode == 0 {
					continue
				}
				// Decode: one generated token, a function of the last.
				next := r.tokens[len(r.tokens)-1]*31 + 7
				r.tokens = append(r.tokens, next%50000)
				r.chain.Append(nil, next%50000)
				r.conn.Hashes = r.chain.Hashes()
				r.decode--
				if need := (len(r.tokens) + bs - 1) / bs; need > len(r.blocks) {
					b, ok := e.alloc(r)
					if !ok {
						// No room: undo the token; the request is
						// preempted after the step, freeing its blocks.
						r.tokens = r.tokens[:len(r.tokens)-1]
						r.decode++
						r.chain.Reset()
						r.chain.Append(nil, r.tokens...)
						r.conn.Hashes = r.chain.Hashes()
						victims = append(victims, r)
						continue
					}
					r.blocks = append(r.blocks, b)
				}
			}
			to := len(r.tokens)
			if chunk > 0 && to-r.computed > chunk {
				to = r.computed + chunk
			}
			if err := e.pair.Scheduler.Scheduled(&r.conn, r.blocks, to); err != nil {
				e.t.Fatalf("Scheduled(%s, %d): %v", r.conn.ID, to, err)
			}
			computed = append(computed, work{r, r.computed, to})
			r.computed = to
		}
	}
	meta := e.pair.Scheduler.Plan()
	if meta.Generation != e.id.Generation {
		e.t.Fatalf("Plan().Generation = %d, want %d", meta.Generation, e.id.Generation)
	}
	ev := &event{}
	for rank, w := range e.pair.Workers {
		if err := w.Start(ctx, meta); err != nil {
			e.t.Fatalf("worker %d: Start: %v", rank, err)
		}
		if err := w.Save(ctx, ev); err != nil {
			e.t.Fatalf("worker %d: Save: %v", rank, err)
		}
	}
	// The step's compute: it writes the blocks it completes after Save was
	// called and before the ready event fires, as a GPU would.
	for _, wk := range computed {
		for i := wk.from / bs; i < wk.to/bs; i++ {
			for rank := range e.pair.Workers {
				e.writeBlock(rank, wk.r.blocks[i], wk.r.conn.Hashes[i])
			}
		}
	}
	ev.fired.Store(true)
	e.update()
	// Requests that are complete finish.
	kept := e.reqs[:0]
	for _, r := range e.reqs {
		if r.failed || r.phase == running && r.computed == len(r.tokens) && r.decode == 0 {
			e.finish(r)
			continue
		}
		kept = append(kept, r)
	}
	clear(e.reqs[len(kept):])
	e.reqs = kept
	for _, r := range victims {
		if slices.Contains(e.reqs, r) {
			e.preempt(r)
		}
	}
}

// update polls every worker and applies the scheduler half's Progress.
func (e *engine) update() {
	e.t.Helper()
	e.outs = e.outs[:0]
	for _, w := range e.pair.Workers {
		e.outs = append(e.outs, w.Poll())
	}
	p, err := e.pair.Scheduler.Update(e.outs)
	if err != nil {
		e.t.Fatalf("Update: %v", err)
	}
	bs := e.id.Layout.BlockSize
	for _, id := range p.Loaded {
		r := e.find(id)
		if r == nil || !r.inLoad {
			e.t.Fatalf("Progress.Loaded names %s, which is not loading", id)
		}
		r.inLoad = false
		if r.phase == done {
			if r.gen == e.id.Generation {
				for i := r.loadFrom; i < r.loadFrom+r.loadN; i++ {
					e.checkBlock("loaded", r, i, r.blocks[i], r.conn.Hashes[i])
				}
			}
			continue
		}
		for i := r.loadFrom; i < r.loadFrom+r.loadN; i++ {
			e.checkBlock("loaded", r, i, r.blocks[i], r.conn.Hashes[i])
		}
		e.stats.loads++
		r.computed = (r.loadFrom + r.loadN) * bs
		if r.phase != done {
			r.phase = running
		}
	}
	for _, f := range p.Failed {
		r := e.find(f.Req)
		if r == nil || !r.inLoad {
			e.t.Fatalf("Progress.Failed names %s, which is not loading", f.Req)
		}
		r.inLoad = false
		if f.Valid%bs != 0 || f.Valid < r.loadFrom*bs || f.Valid >= (r.loadFrom+r.loadN)*bs {
			e.t.Fatalf("Progress.Failed: %s valid = %d tokens, want a block boundary in [%d, %d)", f.Req, f.Valid, r.loadFrom*bs, (r.loadFrom+r.loadN)*bs)
		}
		for i := r.loadFrom; i < f.Valid/bs; i++ {
			e.checkBlock("loaded (before the failure)", r, i, r.blocks[i], r.conn.Hashes[i])
		}
		e.stats.failedLoads++
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
			e.t.Fatalf("Progress.Released names %s, which keeps no blocks", id)
		}
		delete(e.kept, id)
		e.freeBlocks(r)
	}
}

func (e *engine) find(id connector.RequestID) *freq {
	for _, r := range e.reqs {
		if r.conn.ID == id {
			return r
		}
	}
	return e.kept[id]
}

// finish ends r in the connector and frees its blocks, now or on release.
func (e *engine) finish(r *freq) {
	e.t.Helper()
	keep, err := e.pair.Scheduler.Finish(&r.conn, r.blocks)
	if err != nil {
		e.t.Fatalf("Finish(%s): %v", r.conn.ID, err)
	}
	e.stats.finished++
	if r.inLoad {
		// A load still runs: its blocks must be kept.
		if !keep {
			e.t.Fatalf("Finish(%s) = keep false while its load runs", r.conn.ID)
		}
	}
	r.phase = done
	if keep {
		e.kept[r.conn.ID] = r
		if src, ok := e.pair.Scheduler.(connector.TransferParamsSource); ok && !r.failed && r.computed == len(r.tokens) {
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
	bs := e.id.Layout.BlockSize
	valid := r.computed / bs
	if r.gen != e.id.Generation {
		valid = 0 // computed under older weights: never cached
	}
	for i, b := range r.blocks {
		if i < valid && i < len(r.conn.Hashes) {
			h := r.conn.Hashes[i]
			if _, dup := e.cache[h]; !dup {
				e.clock++
				e.blocks[b] = block{cached: true, hash: h, gen: e.id.Generation, lru: e.clock}
				e.cache[h] = b
				continue
			}
		}
		e.release(b)
	}
	r.blocks = nil
}

// preempt ends a running or loading request and queues it again from
// scratch under a new ID.
func (e *engine) preempt(r *freq) {
	e.t.Helper()
	prompt := r.tokens[:r.conn.Prompt]
	decode := r.decode + len(r.tokens) - r.conn.Prompt
	for i, q := range e.reqs {
		if q == r {
			e.reqs = slices.Delete(e.reqs, i, i+1)
			break
		}
	}
	if r.matched {
		e.finish(r)
	}
	// Again from scratch, with the parameters it arrived with: a connector
	// must cope with parameters whose offer has since been withdrawn.
	e.addWith(prompt, decode, r.conn.TransferParams)
}

// rotate moves to the next weights generation.
func (e *engine) rotate(rot connector.Rotator) {
	e.t.Helper()
	gen := e.id.Generation + 1
	if err := rot.Rotate(gen); err != nil {
		e.t.Fatalf("Rotate(%d): %v", gen, err)
	}
	// Every block computed under the old weights is stale: drop the local
	// cache and restart every request.
	for _, r := range slices.Clone(e.reqs) {
		e.preempt(r)
	}
	e.id.Generation = gen
	e.dropCache()
	for _, r := range e.reqs {
		r.gen = gen // queued again from scratch: computed under the new weights
	}
	ns, err := e.id.Namespace()
	if err != nil {
		e.t.Fatalf("Namespace: %v", err)
	}
	e.ns = ns
}

// busy reports whether requests or kept blocks remain.
func (e *engine) busy() bool { return len(e.reqs) > 0 || len(e.kept) > 0 }

// close closes the pair and frees the KV memory.
func (e *engine) close() error {
	var first error
	for _, w := range e.pair.Workers {
		if err := w.Close(); err != nil && first == nil {
			first = err
		}
	}
	if err := e.pair.Scheduler.Close(); err != nil && first == nil {
		first = err
	}
	for _, m := range e.mem {
		if err := m.Free(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// describe summarizes the engine's requests, for failure messages.
func (e *engine) describe() string {
	s := fmt.Sprintf("%d free blocks, %d cached;", len(e.free), len(e.cache))
	for _, r := range e.reqs {
		s += fmt.Sprintf(" [%s phase %d, %d/%d tokens computed, %d blocks, decode %d, pending %d, in load %v]",
			r.conn.ID, r.phase, r.computed, len(r.tokens), len(r.blocks), r.decode, r.pending, r.inLoad)
	}
	for id := range e.kept {
		s += fmt.Sprintf(" [%s kept]", id)
	}
	return s
}
