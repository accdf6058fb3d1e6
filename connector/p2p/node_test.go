//go:build unix

package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// poison fills free blocks: a write into a block the engine freed shows
// when the block is handed out again.
const poison = 0xA5

// tb is the part of testing.TB and *rapid.T the nodes use.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// node is a model inference engine with paged KV memory and the P2P
// connector: a producer or a consumer. Every block's bytes are a function
// of (tenant, generation, shard, block hash), so that any loaded block can
// be checked byte for byte.
type node struct {
	t    tb
	name string
	// unsettled: a worker's Close found transfers that never settled, so
	// its memory stays mapped: close expects rdma.ErrBusy from it and
	// frees no memory, as an engine must.
	unsettled bool
	id        hashing.Identity
	ns        hashing.Namespace
	sched     *Planner
	workers   []*Worker
	engines   []rdma.Engine
	kv        []connector.KVCache
	mem       []*rdma.HostMemory
	free      []connector.BlockID
	reqs      map[connector.RequestID]*nreq
	kept      map[connector.RequestID]*nreq
	clock     time.Time // the workers' clock
	outs      []*connector.Output
}

// nreq is one request of a node.
type nreq struct {
	conn     connector.Request
	tokens   []hashing.Token
	blocks   []connector.BlockID
	load     int  // consumer: tokens being loaded, from loadFrom
	loadFrom int  // consumer: first block of the load
	loaded   bool // consumer: Progress listed it loaded
	failed   *connector.LoadFailure
	released bool
}

type nodeOpts struct {
	tenant string
	gen    uint64
	tp     int
	repl   int
	bs     int
	blocks int
	// blockBytes is KVCache.BlockBytes, 64 when 0.
	blockBytes int
	order      connector.Order
	role       connector.Role
	policy     connector.Policy
	extra      map[string]any
	// wrap, when set, wraps each rank's loopback engine (fault injection).
	wrap func(rank int, e rdma.Engine) rdma.Engine
	// engine, when set, opens each rank's engine instead of a loopback
	// engine on the fabric.
	engine func(rank int) rdma.Engine
}

func testIdentity(o nodeOpts) hashing.Identity {
	return hashing.Identity{
		Tenant:         o.tenant,
		Model:          "p2ptest/model",
		WeightsVersion: "v1",
		Generation:     o.gen,
		Format:         hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout:         hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: o.bs, TPSize: o.tp, Replication: o.repl},
	}
}

// newNode opens a node on fabric f, its engines named name/rank.
func newNode(t tb, f *rdma.Fabric, name string, o nodeOpts) *node {
	t.Helper()
	if o.tenant == "" {
		o.tenant = "tenant0"
	}
	if o.order == 0 {
		o.order = connector.BlockMajor
	}
	if o.blockBytes == 0 {
		o.blockBytes = 64
	}
	if o.policy == "" {
		o.policy = connector.PolicyRecompute
	}
	id := testIdentity(o)
	ns, err := id.Namespace()
	if err != nil {
		t.Fatalf("Namespace: %v", err)
	}
	n := &node{t: t, name: name, id: id, ns: ns, reqs: map[connector.RequestID]*nreq{}, kept: map[connector.RequestID]*nreq{}, clock: time.Unix(1e9, 0)}
	for rank := range o.tp {
		if o.engine != nil {
			n.engines = append(n.engines, o.engine(rank))
			continue
		}
		e, err := f.NewEngine(fmt.Sprintf("%s/%d", name, rank), &rdma.LoopbackOptions{Workers: 1})
		if err != nil {
			t.Fatalf("NewEngine: %v", err)
		}
		var eng rdma.Engine = e
		if o.wrap != nil {
			eng = o.wrap(rank, e)
		}
		n.engines = append(n.engines, eng)
	}
	cfg := connector.Config{Connector: Name, Role: o.role, LoadFailurePolicy: o.policy, Extra: o.extra, EngineID: name}
	n.sched, n.workers, err = New(cfg, connector.Env{Identity: id}, n.engines...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for rank, w := range n.workers {
		w.now = func() time.Time { return n.clock }
		kv := connector.KVCache{Layers: 2, Blocks: o.blocks, KV: 2, BlockBytes: o.blockBytes, Order: o.order}
		m, err := rdma.AllocHost(kv.Layers * kv.KV * kv.Blocks * kv.BlockBytes)
		if err != nil {
			t.Fatalf("AllocHost: %v", err)
		}
		fill(m.Bytes(), poison)
		n.mem = append(n.mem, m)
		if o.order == connector.LayerMajor && rank%2 == 1 {
			// One region per layer on odd ranks: both forms of layer-major memory.
			per := m.Len() / kv.Layers
			for l := range kv.Layers {
				r, err := m.Region().Sub(l*per, per)
				if err != nil {
					t.Fatalf("Sub: %v", err)
				}
				kv.Regions = append(kv.Regions, r)
			}
		} else {
			kv.Regions = []rdma.Region{m.Region()}
		}
		if err := w.Register(kv); err != nil {
			t.Fatalf("rank %d: Register: %v", rank, err)
		}
		n.kv = append(n.kv, kv)
	}
	for b := o.blocks - 1; b >= 0; b-- {
		n.free = append(n.free, connector.BlockID(b))
	}
	return n
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// close closes the connector halves, the engines and the memory.
func (n *node) close() error {
	var errs []error
	for _, w := range n.workers {
		err := w.Close()
		if n.unsettled && errors.Is(err, rdma.ErrBusy) {
			err = nil
		}
		errs = append(errs, err)
	}
	errs = append(errs, n.sched.Close())
	if n.unsettled {
		return errors.Join(errs...) // the memory and engines stay: a transfer may still write them
	}
	for _, e := range n.engines {
		errs = append(errs, e.Close())
	}
	for _, m := range n.mem {
		errs = append(errs, m.Free())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// content writes into dst the KV bytes of a block with hash h for shard.
func (n *node) content(dst []byte, shard int, h hashing.BlockHash) {
	seed := binary.LittleEndian.Uint64(h[:8]) ^ n.id.Generation*0x9e3779b97f4a7c15 ^ uint64(shard+1)*0xbf58476d1ce4e5b9
	for _, c := range n.id.Tenant {
		seed = seed*31 + uint64(c)
	}
	for i := 0; i+8 <= len(dst); i += 8 {
		seed += 0x9e3779b97f4a7c15
		z := (seed ^ seed>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
}

// blockBytes gathers block b of rank in store order.
func (n *node) blockBytes(rank int, b connector.BlockID) []byte {
	var out []byte
	for _, sp := range n.kv[rank].Spans(nil, b) {
		out = append(out, sp.Bytes()...)
	}
	return out
}

// write computes block b: its expected bytes for hash h, in every rank.
func (n *node) write(b connector.BlockID, h hashing.BlockHash) {
	for rank := range n.kv {
		buf := make([]byte, n.kv[rank].BlockSize())
		n.content(buf, n.ns.Shard(rank), h)
		for _, sp := range n.kv[rank].Spans(nil, b) {
			k := copy(sp.Bytes(), buf)
			buf = buf[k:]
		}
	}
}

// check fails unless block b holds the bytes of hash h in every rank.
func (n *node) check(what string, b connector.BlockID, h hashing.BlockHash) {
	n.t.Helper()
	for rank := range n.kv {
		want := make([]byte, n.kv[rank].BlockSize())
		n.content(want, n.ns.Shard(rank), h)
		if got := n.blockBytes(rank, b); !bytes.Equal(got, want) {
			n.t.Fatalf("%s: %s: block %d, rank %d: bytes differ from the KV of its hash", n.name, what, b, rank)
		}
	}
}

// isPoisoned reports whether block b is untouched since it was freed.
func (n *node) isPoisoned(b connector.BlockID) bool {
	for rank := range n.kv {
		for _, c := range n.blockBytes(rank, b) {
			if c != poison {
				return false
			}
		}
	}
	return true
}

func (n *node) alloc() connector.BlockID {
	n.t.Helper()
	if len(n.free) == 0 {
		n.t.Fatalf("%s: out of blocks", n.name)
	}
	b := n.free[len(n.free)-1]
	n.free = n.free[:len(n.free)-1]
	if !n.isPoisoned(b) {
		n.t.Fatalf("%s: block %d was written after the engine freed it", n.name, b)
	}
	return b
}

func (n *node) release(blocks []connector.BlockID) {
	for _, b := range blocks {
		for rank := range n.kv {
			for _, sp := range n.kv[rank].Spans(nil, b) {
				fill(sp.Bytes(), poison)
			}
		}
		n.free = append(n.free, b)
	}
}

// newReq makes a request for prompt, with its block hashes.
func (n *node) newReq(id string, prompt []hashing.Token) *nreq {
	n.t.Helper()
	hs, err := hashing.HashBlocks(n.id.Layout.BlockSize, prompt)
	if err != nil {
		n.t.Fatalf("HashBlocks: %v", err)
	}
	r := &nreq{tokens: prompt}
	r.conn = connector.Request{ID: connector.RequestID(id), Prompt: len(prompt), Hashes: hs}
	n.reqs[r.conn.ID] = r
	return r
}

// prefill runs a whole prompt on a producer in one step and finishes the
// request, returning its transfer parameters (nil when it was not kept).
func (n *node) prefill(id string, prompt []hashing.Token) []byte {
	n.t.Helper()
	r := n.newReq(id, prompt)
	if m, err := n.sched.Match(&r.conn, 0); err != nil || m.Tokens != 0 {
		n.t.Fatalf("%s: producer Match = %+v, %v, want 0 tokens", n.name, m, err)
	}
	bs := n.id.Layout.BlockSize
	for range (len(prompt) + bs - 1) / bs {
		r.blocks = append(r.blocks, n.alloc())
	}
	if err := n.sched.Allocated(&r.conn, 0, r.blocks); err != nil {
		n.t.Fatalf("Allocated: %v", err)
	}
	if err := n.sched.Scheduled(&r.conn, len(prompt), r.blocks); err != nil {
		n.t.Fatalf("Scheduled: %v", err)
	}
	n.step(func() {
		for i := 0; i < len(prompt)/bs; i++ {
			n.write(r.blocks[i], r.conn.Hashes[i])
		}
	})
	keep, err := n.sched.Finish(&r.conn, r.blocks)
	if err != nil {
		n.t.Fatalf("Finish: %v", err)
	}
	delete(n.reqs, r.conn.ID)
	if !keep {
		n.release(r.blocks)
		return nil
	}
	n.kept[r.conn.ID] = r
	p, err := n.sched.TransferParams(r.conn.ID)
	if err != nil {
		n.t.Fatalf("TransferParams: %v", err)
	}
	return p
}

// admit starts a consumer request: parameters, match after a local hit of
// local blocks (which it fills itself), allocation. It returns the
// matched tokens.
func (n *node) admit(id string, prompt []hashing.Token, params []byte, local int) (*nreq, int) {
	n.t.Helper()
	r := n.newReq(id, prompt)
	if params != nil {
		if err := n.sched.SetParams(r.conn.ID, params); err != nil {
			n.t.Fatalf("SetParams: %v", err)
		}
	}
	bs := n.id.Layout.BlockSize
	m, err := n.sched.Match(&r.conn, local*bs)
	if err != nil || m.Pending {
		n.t.Fatalf("Match = %+v, %v", m, err)
	}
	if m.Tokens%bs != 0 || local*bs+m.Tokens >= len(prompt) {
		n.t.Fatalf("Match(%s) = %d tokens after %d: not whole blocks, or covers the last prompt token of %d", id, m.Tokens, local*bs, len(prompt))
	}
	for range (len(prompt) + bs - 1) / bs {
		r.blocks = append(r.blocks, n.alloc())
	}
	for i := range local {
		n.write(r.blocks[i], r.conn.Hashes[i])
	}
	if err := n.sched.Allocated(&r.conn, m.Tokens, r.blocks); err != nil {
		n.t.Fatalf("Allocated: %v", err)
	}
	r.load, r.loadFrom = m.Tokens, local
	return r, m.Tokens
}

// step runs one engine step: Plan, Start and Save in every worker, the
// step's compute, Poll and Update.
func (n *node) step(compute func()) {
	n.t.Helper()
	m := n.sched.Plan()
	for rank, w := range n.workers {
		if err := w.Start(context.Background(), m); err != nil {
			n.t.Fatalf("%s: worker %d: Start: %v", n.name, rank, err)
		}
		if err := w.Save(context.Background(), connector.Ready); err != nil {
			n.t.Fatalf("%s: worker %d: Save: %v", n.name, rank, err)
		}
	}
	if compute != nil {
		compute()
	}
	n.update()
}

func (n *node) update() {
	n.t.Helper()
	n.outs = n.outs[:0]
	for _, w := range n.workers {
		n.outs = append(n.outs, w.Poll())
	}
	p, err := n.sched.Update(n.outs)
	if err != nil {
		n.t.Fatalf("%s: Update: %v", n.name, err)
	}
	bs := n.id.Layout.BlockSize
	for _, id := range p.Loaded {
		r := n.reqs[id]
		if r == nil || r.load == 0 || r.loaded || r.failed != nil {
			n.t.Fatalf("%s: Progress.Loaded names %s, which is not loading", n.name, id)
		}
		r.loaded = true
		for i := r.loadFrom; i < r.loadFrom+r.load/bs; i++ {
			n.check("loaded", r.blocks[i], r.conn.Hashes[i])
		}
	}
	for _, f := range p.Failed {
		r := n.reqs[f.Req]
		if r == nil || r.load == 0 || r.loaded || r.failed != nil {
			n.t.Fatalf("%s: Progress.Failed names %s, which is not loading", n.name, f.Req)
		}
		if f.Valid%bs != 0 || f.Valid < r.loadFrom*bs || f.Valid >= r.loadFrom*bs+r.load {
			n.t.Fatalf("%s: Progress.Failed: %s valid = %d, want a block boundary in [%d, %d)", n.name, f.Req, f.Valid, r.loadFrom*bs, r.loadFrom*bs+r.load)
		}
		for i := r.loadFrom; i < f.Valid/bs; i++ {
			n.check("loaded before the failure", r.blocks[i], r.conn.Hashes[i])
		}
		r.failed = &f
	}
	for _, id := range p.Released {
		r := n.kept[id]
		if r == nil {
			n.t.Fatalf("%s: Progress.Released names %s, which keeps no blocks", n.name, id)
		}
		delete(n.kept, id)
		r.released = true
		n.release(r.blocks)
	}
}

// finish ends a consumer request and frees its blocks (or keeps them).
func (n *node) finish(r *nreq) {
	n.t.Helper()
	keep, err := n.sched.Finish(&r.conn, r.blocks)
	if err != nil {
		n.t.Fatalf("Finish: %v", err)
	}
	delete(n.reqs, r.conn.ID)
	if keep {
		n.kept[r.conn.ID] = r
		return
	}
	n.release(r.blocks)
}

// settle steps both nodes until cond holds, failing after a bound.
func settle(t tb, cond func() bool, nodes ...*node) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		for _, n := range nodes {
			n.step(nil)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress after 20 s")
		}
	}
}

// awaitArmed waits until every producer worker of n armed offer, failing
// after a bound: workers that digest their blocks arm on a goroutine.
func (n *node) awaitArmed(offer uint64, slot int) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for rank, w := range n.workers {
		for w.slot(slot).Load() != armed(offer) {
			if time.Now().After(deadline) {
				n.t.Fatalf("%s: worker %d did not arm offer %d in slot %d within 20 s", n.name, rank, offer, slot)
			}
			runtime.Gosched()
		}
	}
}

// prompt returns n tokens starting at seed.
func prompt(seed, n int) []hashing.Token {
	p := make([]hashing.Token, n)
	for i := range p {
		p[i] = hashing.Token(seed + i*7)
	}
	return p
}
