package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

func testIdentity(bs int) hashing.Identity {
	return hashing.Identity{
		Tenant:         "acme",
		Model:          "tiny",
		WeightsVersion: "v1",
		Format:         hashing.Format{Device: "cpu", ModelDType: hashing.BF16, KVDType: hashing.BF16},
		Layout:         hashing.Layout{Layers: 2, KVHeads: 2, HeadDim: 8, BlockSize: bs, TPSize: 1, Replication: 1},
	}
}

// hybridIdentity is a hybrid model's identity: layer 0 full attention,
// layer 1 a sliding window of window tokens, layer 2 a recurrent state;
// kinds picks which of them the layout has (in that order).
func hybridIdentity(bs, window int, kinds ...hashing.GroupKind) hashing.Identity {
	id := testIdentity(bs)
	if len(kinds) == 0 {
		kinds = []hashing.GroupKind{hashing.FullAttention, hashing.SlidingWindow, hashing.RecurrentState}
	}
	id.Layout.Layers = len(kinds)
	for i, k := range kinds {
		g := hashing.Group{Kind: k, Layers: []int{i}, BlockSize: bs}
		switch k {
		case hashing.SlidingWindow:
			g.Window = window
		case hashing.RecurrentState:
			g.StateBytes = 64
		}
		id.Layout.Groups = append(id.Layout.Groups, g)
	}
	return id
}

// harness drives a Scheduler like an engine: it checks, for every planned
// item, that the KV of the positions before it (the state at its start,
// for a state group) is what a model would have computed, writes the
// item's KV and states, and samples deterministic tokens.
type harness struct {
	t      tb
	s      *Scheduler
	conn   *fakeConn // nil without a connector
	groups []fakeGroup
	mems   []*kvMem // per group
	reqs   map[connector.RequestID]*modelReq
	plan   *Plan
	ended  []Ended
}

// modelReq is the harness's own record of a request: what the scheduler
// should hold for it.
type modelReq struct {
	id      connector.RequestID
	salt    string
	tokens  []hashing.Token
	digests []uint64
	maxGen  int // the harness finishes it after this many tokens
	gen     int
	ended   bool
}

func (m *modelReq) extras() []hashing.Extra {
	if m.salt == "" {
		return nil
	}
	return []hashing.Extra{hashing.CacheSalt(m.salt)}
}

// tb is what the harness needs of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Connector kinds a harness can drive.
const (
	noConn        = iota // no connector
	withConn             // the fake connector
	withPlainConn        // the fake connector without Rotator
)

func newHarness(t tb, cfg Config, kind int) *harness {
	t.Helper()
	l := cfg.Identity.Layout
	h := &harness{t: t, reqs: map[connector.RequestID]*modelReq{}}
	for g, spec := range l.EffectiveGroups() {
		h.groups = append(h.groups, fakeGroup{kind: spec.Kind, window: spec.Window})
		vals := l.BlockSize
		if spec.Kind == hashing.RecurrentState {
			vals = 1 // one state
		}
		h.mems = append(h.mems, newKVMem(cfg.poolSize(g), vals))
	}
	var conn connector.Planner
	if kind != noConn {
		h.conn = newFakeConn(l, h.mems)
		conn = h.conn
		if kind == withPlainConn {
			conn = plainConn{h.conn}
		}
	}
	s, err := New(cfg, conn)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.s = s
	return h
}

func testConfig(blocks, bs, budget int) Config {
	return Config{Identity: testIdentity(bs), Blocks: blocks, MaxBatchedTokens: budget, PrefixCaching: true}
}

// add adds a request with the given prompt; maxGen tokens are generated.
func (h *harness) add(id string, salt string, prompt []hashing.Token, maxGen int) error {
	m := &modelReq{id: connector.RequestID(id), salt: salt, tokens: slices.Clone(prompt), maxGen: maxGen}
	err := h.s.Add(Request{ID: m.id, Prompt: prompt, Extras: m.extras(), MaxTokens: maxGen})
	if err == nil {
		h.reqs[m.id] = m
	}
	return err
}

func (h *harness) mustAdd(id string, prompt []hashing.Token, maxGen int) {
	h.t.Helper()
	if err := h.add(id, "", prompt, maxGen); err != nil {
		h.t.Fatalf("Add(%q): %v", id, err)
	}
}

// nextToken is the "model": a function of the prefix digest.
func nextToken(d uint64) hashing.Token { return hashing.Token(d>>7) % 50 }

// step runs Step and computes its plan, checking the KV every item attends to.
func (h *harness) step() *Plan {
	h.t.Helper()
	p, err := h.s.Step()
	if err != nil {
		h.t.Fatalf("Step: %v", err)
	}
	if err := h.compute(p); err != nil {
		h.t.Fatal(err)
	}
	h.plan = p
	return p
}

func (h *harness) compute(p *Plan) error {
	for _, it := range p.Items {
		m := h.reqs[it.ID]
		if m == nil {
			return fmt.Errorf("step %d plans unknown request %q", p.Step, it.ID)
		}
		if !slices.Equal(it.Tokens, m.tokens[:it.End]) {
			return fmt.Errorf("step %d: %q tokens differ from the model's", p.Step, it.ID)
		}
		if it.Start >= it.End || it.End > len(m.tokens) || len(it.Tables) != len(h.groups) || !slices.Equal(it.Blocks, it.Tables[0]) {
			return fmt.Errorf("step %d: %q item [%d, %d) with %d tables for %d tokens", p.Step, it.ID, it.Start, it.End, len(it.Tables), len(m.tokens))
		}
		if it.Sample != (it.End == len(m.tokens)) {
			return fmt.Errorf("step %d: %q Sample = %v at End %d of %d tokens", p.Step, it.ID, it.Sample, it.End, len(m.tokens))
		}
		m.digests = prefixDigests(m.digests, m.salt, m.tokens)
		for g, gr := range h.groups {
			if err := h.computeGroup(g, gr, it, m.digests); err != nil {
				return fmt.Errorf("step %d: request %q [%d, %d), group %d (%s): %v", p.Step, it.ID, it.Start, it.End, g, gr.kind, err)
			}
		}
	}
	return nil
}

// computeGroup checks what item it reads of group g and writes what it
// computes: KV of its positions, or the states StateEntries names.
func (h *harness) computeGroup(g int, gr fakeGroup, it Item, digests []uint64) error {
	t, mem, bs := it.Tables[g], h.mems[g], h.s.bs
	entry := func(j int) (BlockID, error) {
		if j < 0 || j >= len(t) || t[j] == connector.NoBlock || int(t[j]) >= len(mem.vals) {
			return 0, fmt.Errorf("entry %d of %d-entry table %v has no block", j, len(t), t)
		}
		return t[j], nil
	}
	switch gr.kind {
	case hashing.RecurrentState:
		st := it.State
		if it.Start > 0 {
			b, err := entry(st.In)
			if err != nil {
				return fmt.Errorf("state in: %v", err)
			}
			if got := mem.vals[b][0]; got != digests[it.Start-1] {
				return fmt.Errorf("the state at entry %d (block %d) is %#x, not the state after %d tokens %#x", st.In, b, got, it.Start, digests[it.Start-1])
			}
		}
		if st.Snapshot >= 0 {
			n := (st.Snapshot + 1) * bs
			b, err := entry(st.Snapshot)
			if err != nil {
				return fmt.Errorf("snapshot: %v", err)
			}
			if n <= it.Start || n >= it.End {
				return fmt.Errorf("snapshot entry %d: the boundary at %d is not inside the item", st.Snapshot, n)
			}
			mem.vals[b][0] = digests[n-1]
		}
		b, err := entry(st.Out)
		if err != nil {
			return fmt.Errorf("state out: %v", err)
		}
		mem.vals[b][0] = digests[it.End-1]
		return nil
	case hashing.SlidingWindow:
		if len(t)*bs < it.End {
			return fmt.Errorf("%d blocks for %d tokens", len(t), it.End)
		}
		if err := mem.verify(t, digests, max(0, it.Start-gr.window+1), it.Start); err != nil {
			return fmt.Errorf("attends to wrong KV: %v", err)
		}
	default:
		if len(t)*bs < it.End {
			return fmt.Errorf("%d blocks for %d tokens", len(t), it.End)
		}
		if err := mem.verify(t, digests, 0, it.Start); err != nil {
			return fmt.Errorf("attends to wrong KV: %v", err)
		}
	}
	for pos := it.Start; pos < it.End; pos++ {
		if _, err := entry(pos / bs); err != nil {
			return fmt.Errorf("position %d: %v", pos, err)
		}
	}
	mem.write(t, digests, it.Start, it.End)
	return nil
}

// results returns the sampled tokens of the plan, finishing requests that
// reached their maxGen.
func (h *harness) results(p *Plan) []Result {
	var res []Result
	for _, it := range p.Items {
		if !it.Sample {
			continue
		}
		m := h.reqs[it.ID]
		res = append(res, Result{ID: it.ID, Token: nextToken(m.digests[it.End-1]), Finished: m.gen+1 >= m.maxGen})
	}
	return res
}

// done completes the plan with the model's results and records them.
func (h *harness) done(p *Plan, res []Result) {
	h.t.Helper()
	if err := h.s.Done(res, h.outs()); err != nil {
		h.t.Fatalf("Done: %v", err)
	}
	h.apply(res)
}

// outs returns the workers' Outputs of the step that ran: nil without a
// connector.
func (h *harness) outs() []*connector.Output {
	if h.conn == nil {
		return nil
	}
	return []*connector.Output{h.conn.poll()}
}

func (h *harness) apply(res []Result) {
	for _, r := range res {
		m := h.reqs[r.ID]
		m.tokens = append(m.tokens, r.Token)
		m.gen++
		if r.Finished {
			m.ended = true
		}
	}
	for _, e := range h.s.TakeEnded(nil) {
		h.ended = append(h.ended, e)
		h.reqs[e.ID].ended = true
	}
}

// run steps until every request ended and no blocks are held, or fails
// after limit steps.
func (h *harness) run(limit int) {
	h.t.Helper()
	for i := 0; i < limit; i++ {
		if len(h.s.reqs) == 0 {
			return
		}
		p := h.step()
		h.done(p, h.results(p))
		if err := errors.Join(h.check(), h.settled()); err != nil {
			h.t.Fatalf("after step %d: %v", p.Step, err)
		}
	}
	h.t.Fatalf("not drained after %d steps: %d requests left: %v", limit, len(h.s.reqs), h.s.Stats())
}

// check verifies the scheduler's invariants against the pool and the
// connector's transfers.
func (h *harness) check() error {
	return checkInvariants(h.s, h.conn, h.reqs)
}

// settled checks, between a Done and the next Step, what the tables of
// every running request hold: in a state group, every kept entry the
// state at its block's end, and the entry of the last computed token the
// state after it.
func (h *harness) settled() error {
	for id, r := range h.s.reqs {
		m := h.reqs[id]
		if r.state != Running || m == nil || r.computed == 0 {
			continue
		}
		d := prefixDigests(nil, m.salt, m.tokens)
		for g, gr := range h.groups {
			if gr.kind != hashing.RecurrentState {
				continue
			}
			t := r.tabs[g]
			for j, b := range t {
				if b == connector.NoBlock {
					continue
				}
				want := -1 // the tokens whose state the entry must hold
				switch {
				case j < r.computed/h.s.bs:
					want = (j + 1) * h.s.bs
				case j == (r.computed-1)/h.s.bs:
					want = r.computed
				}
				if want < 0 {
					return fmt.Errorf("request %q (%d tokens computed) keeps state entry %d of group %d, past the state it reached", id, r.computed, j, g)
				}
				if got := h.mems[g].vals[b][0]; got != d[want-1] {
					return fmt.Errorf("request %q (%d tokens computed): state entry %d (block %d) of group %d holds %#x, not the state after %d tokens %#x", id, r.computed, j, b, g, got, want, d[want-1])
				}
			}
			if lacks(t, (r.computed-1)/h.s.bs) {
				return fmt.Errorf("request %q (%d tokens computed) has no state entry %d in group %d: %v", id, r.computed, (r.computed-1)/h.s.bs, g, t)
			}
		}
	}
	return nil
}

func checkInvariants(s *Scheduler, conn *fakeConn, model map[connector.RequestID]*modelReq) error {
	var total PoolStats
	for g, p := range s.pools {
		if err := p.Check(); err != nil {
			return fmt.Errorf("group %d: %w", g, err)
		}
		total.add(p.Stats())
	}
	if st := s.Stats().Pool; st != total || st.Free+st.Used+st.Cached != st.Blocks {
		return fmt.Errorf("Stats().Pool = %+v, the pools add up to %+v", st, total)
	}
	ids := make([]connector.RequestID, 0, len(s.reqs))
	for id := range s.reqs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for g := range s.groups {
		if err := checkGroup(s, g, ids); err != nil {
			return fmt.Errorf("group %d (%s): %w", g, s.groups[g].kind, err)
		}
	}
	inQueue := 0
	for _, id := range ids {
		r := s.reqs[id]
		if r.id != id {
			return fmt.Errorf("request %q filed under %q", r.id, id)
		}
		if m := model[id]; m != nil && !slices.Equal(r.tokens, m.tokens) {
			return fmt.Errorf("request %q holds %d tokens, the model %d", id, len(r.tokens), len(m.tokens))
		}
		want, _ := hashing.HashBlocks(s.bs, r.tokens, r.chainExtras(model)...)
		if !slices.Equal(r.hashes(), want) {
			return fmt.Errorf("request %q: %d incremental hashes differ from HashBlocks' %d", id, len(r.hashes()), len(want))
		}
		switch r.state {
		case Waiting, LookupPending:
			if r.blocks() != 0 || r.held {
				return fmt.Errorf("%v request %q holds %d blocks (held %v)", r.state, id, r.blocks(), r.held)
			}
			if s.waiting.find(r) < 0 {
				return fmt.Errorf("%v request %q is not in the waiting queue", r.state, id)
			}
			inQueue++
		case Running:
			if s.running.find(r) < 0 {
				return fmt.Errorf("running request %q is not in the running queue", id)
			}
			inQueue++
		case Loading:
			if s.loading.find(r) < 0 {
				return fmt.Errorf("loading request %q is not in the loading queue", id)
			}
			inQueue++
		case Preempted:
			if !r.held {
				return fmt.Errorf("preempted request %q is not held", id)
			}
		default:
			if !r.held {
				return fmt.Errorf("%v request %q is still known but not held", r.state, id)
			}
		}
	}
	if inQueue != len(s.waiting)+len(s.running)+len(s.loading) {
		return fmt.Errorf("queues hold %d requests, %d requests are queued", len(s.waiting)+len(s.running)+len(s.loading), inQueue)
	}
	held := 0
	for _, r := range s.reqs {
		if r.held {
			held++
		}
	}
	if held != s.held {
		return fmt.Errorf("%d requests held, counted %d", held, s.held)
	}
	for g := range s.groups {
		pending := 0
		for _, r := range s.reqs {
			if r.held {
				pending += r.gs[g].exclusive
			}
		}
		if pending != s.pendingFree[g] {
			return fmt.Errorf("group %d: held requests alone hold %d blocks, counted %d", g, pending, s.pendingFree[g])
		}
	}
	if conn != nil {
		if err := conn.err(); err != nil {
			return err
		}
		// A block under transfer stays with its request: in its table,
		// or held after it left a sliding window.
		var err error
		conn.inflight(func(id connector.RequestID, g int, blocks []BlockID) bool {
			r := s.reqs[id]
			if r == nil {
				err = fmt.Errorf("request %q has a transfer running but the scheduler forgot it", id)
				return false
			}
			for _, b := range blocks {
				if !slices.Contains(r.tabs[g], b) && !slices.Contains(r.gs[g].retired, b) || s.pools[g].Refs(b) <= 0 {
					err = fmt.Errorf("block %d of group %d is under a transfer of %q but the request does not hold it (refs %d)", b, g, id, s.pools[g].Refs(b))
					return false
				}
			}
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkGroup checks the tables of group g: references, writers, and the
// shape the group's kind gives them.
func checkGroup(s *Scheduler, g int, ids []connector.RequestID) error {
	p := s.pools[g]
	gr := s.groups[g]
	// Every reference is a request's: count them. A block a running or
	// loading request writes (at or after its committed prefix) is in no
	// other request's table.
	refs := make([]int, p.Len())
	writer := make([]connector.RequestID, p.Len())
	for _, id := range ids {
		r := s.reqs[id]
		if r.state != Running && r.state != Loading {
			continue
		}
		t := r.tabs[g]
		for _, b := range t[min(r.committed, len(t)):] {
			if b >= 0 && int(b) < p.Len() {
				if writer[b] != "" {
					return fmt.Errorf("block %d is written by both %q and %q", b, writer[b], id)
				}
				writer[b] = id
			}
		}
	}
	for _, id := range ids {
		r := s.reqs[id]
		t := r.tabs[g]
		var holds []BlockID
		for _, b := range slices.Concat(t, r.gs[g].retired) {
			if b == connector.NoBlock {
				continue
			}
			if b < 0 || int(b) >= p.Len() {
				return fmt.Errorf("request %q holds block %d, out of range", id, b)
			}
			if slices.Contains(holds, b) {
				return fmt.Errorf("request %q holds block %d twice", id, b)
			}
			holds = append(holds, b)
			refs[b]++
			if writer[b] != "" && writer[b] != id {
				return fmt.Errorf("block %d, which %q writes, is also held by %q (%v)", b, writer[b], id, r.state)
			}
		}
		if n := len(holds); n != r.gs[g].refs {
			return fmt.Errorf("request %q holds %d blocks, counted %d", id, n, r.gs[g].refs)
		}
		if len(r.gs[g].retired) > 0 && (gr.kind != hashing.SlidingWindow || s.conn == nil) {
			return fmt.Errorf("request %q holds %d retired blocks", id, len(r.gs[g].retired))
		}
		if r.state != Running && r.state != Loading {
			continue
		}
		// No over-reservation: at most the blocks of its tokens.
		if len(t) > s.blocksFor(len(r.tokens)) {
			return fmt.Errorf("request %q holds %d blocks for %d tokens", id, len(t), len(r.tokens))
		}
		upTo := s.blocksFor(r.computed + r.external) // entries it must hold, from lo on
		lo := 0
		switch {
		case gr.kind == hashing.SlidingWindow && r.state == Running:
			lo = s.windowFirst(g, r.computed)
			for j := 0; j < min(lo, len(t)); j++ {
				if t[j] != connector.NoBlock {
					return fmt.Errorf("running request %q at %d tokens keeps entry %d, out of the window of %d tokens", id, r.computed, j, gr.window)
				}
			}
		case gr.kind == hashing.SlidingWindow:
			lo = s.windowFirst(g, r.computed+r.external)
		case gr.kind == hashing.RecurrentState:
			lo = max(upTo-1, 0)
			if r.state == Running && r.computed%s.bs != 0 {
				lo = upTo // checked by settled: the running state is mid-block
			}
		}
		if r.state == Loading && gr.kind == hashing.FullAttention && len(t) != upTo {
			return fmt.Errorf("loading request %q holds %d blocks for %d local + %d external tokens", id, len(t), r.computed, r.external)
		}
		for j := lo; j < upTo; j++ {
			if lacks(t, j) {
				return fmt.Errorf("%v request %q at %d + %d tokens lacks entry %d: %v", r.state, id, r.computed, r.external, j, t)
			}
		}
	}
	for b := range refs {
		if refs[b] != p.Refs(BlockID(b)) {
			return fmt.Errorf("block %d: %d references in the pool, %d in request tables", b, p.Refs(BlockID(b)), refs[b])
		}
	}
	return nil
}

// chainExtras returns the extras the model gave r.
func (r *request) chainExtras(model map[connector.RequestID]*modelReq) []hashing.Extra {
	if m := model[r.id]; m != nil {
		return m.extras()
	}
	return nil
}

// snapshot captures the scheduler's observable state, to check that a
// rejected call changed nothing.
type snapshot struct {
	Step     uint64
	InFlight bool
	Stats    Stats
	Reqs     []reqSnap
	Ended    int
	Gen      uint64
}

type reqSnap struct {
	ID     connector.RequestID
	Status Status
	Tokens []hashing.Token
	Blocks [][]BlockID
}

func snap(s *Scheduler) snapshot {
	sn := snapshot{Step: s.step, InFlight: s.inFlight, Stats: s.Stats(), Ended: len(s.ended), Gen: s.id.Generation}
	for id, r := range s.reqs {
		st, _ := s.Status(id)
		var tabs [][]BlockID
		for _, t := range r.tabs {
			tabs = append(tabs, slices.Clone(t))
		}
		sn.Reqs = append(sn.Reqs, reqSnap{ID: id, Status: st, Tokens: slices.Clone(r.tokens), Blocks: tabs})
	}
	sort.Slice(sn.Reqs, func(i, j int) bool { return sn.Reqs[i].ID < sn.Reqs[j].ID })
	return sn
}

func seq(from, n int) []hashing.Token {
	out := make([]hashing.Token, n)
	for i := range out {
		out[i] = hashing.Token(from + i)
	}
	return out
}
