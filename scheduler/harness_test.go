package scheduler

import (
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

// harness drives a Scheduler like an engine: it checks, for every planned
// item, that the KV of the positions before it is what a model would have
// computed, writes the item's KV, and samples deterministic tokens.
type harness struct {
	t     tb
	s     *Scheduler
	conn  *fakeConn // nil without a connector
	mem   *kvMem
	reqs  map[connector.RequestID]*modelReq
	plan  *Plan
	ended []Ended
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
	h := &harness{t: t, mem: newKVMem(cfg.Blocks, cfg.Identity.Layout.BlockSize), reqs: map[connector.RequestID]*modelReq{}}
	var conn connector.Scheduler
	if kind != noConn {
		h.conn = newFakeConn(cfg.Identity.Layout.BlockSize, h.mem)
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
		if it.Start >= it.End || it.End > len(m.tokens) || len(it.Blocks)*h.s.bs < it.End {
			return fmt.Errorf("step %d: %q item [%d, %d) with %d blocks for %d tokens", p.Step, it.ID, it.Start, it.End, len(it.Blocks), len(m.tokens))
		}
		if it.Sample != (it.End == len(m.tokens)) {
			return fmt.Errorf("step %d: %q Sample = %v at End %d of %d tokens", p.Step, it.ID, it.Sample, it.End, len(m.tokens))
		}
		m.digests = prefixDigests(m.digests, m.salt, m.tokens)
		if err := h.mem.verify(it.Blocks, m.digests, it.Start); err != nil {
			return fmt.Errorf("step %d: request %q attends to wrong KV: %v", p.Step, it.ID, err)
		}
		h.mem.write(it.Blocks, m.digests, it.Start, it.End)
	}
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
	if err := h.s.Done(res, nil); err != nil {
		h.t.Fatalf("Done: %v", err)
	}
	h.apply(res)
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
		if err := h.check(); err != nil {
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

func checkInvariants(s *Scheduler, conn *fakeConn, model map[connector.RequestID]*modelReq) error {
	p := s.pool
	if err := p.Check(); err != nil {
		return err
	}
	st := p.Stats()
	if st.Free+st.Used+st.Cached != st.Blocks {
		return fmt.Errorf("free %d + used %d + cached %d != %d", st.Free, st.Used, st.Cached, st.Blocks)
	}
	// Every reference is a request's: count them. A block a running or
	// loading request writes (at or after its committed prefix) is in no
	// other request's table.
	refs := make([]int, p.Len())
	writer := make([]connector.RequestID, p.Len())
	ids := make([]connector.RequestID, 0, len(s.reqs))
	for id := range s.reqs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		r := s.reqs[id]
		if r.state != Running && r.state != Loading {
			continue
		}
		for _, b := range r.blocks[min(r.committed, len(r.blocks)):] {
			if b >= 0 && int(b) < p.Len() {
				if writer[b] != "" {
					return fmt.Errorf("block %d is written by both %q and %q", b, writer[b], id)
				}
				writer[b] = id
			}
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
			if len(r.blocks) != 0 || r.held {
				return fmt.Errorf("%v request %q holds %d blocks (held %v)", r.state, id, len(r.blocks), r.held)
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
		if r.state == Loading && len(r.blocks) != s.blocksFor(r.computed+r.external) {
			return fmt.Errorf("loading request %q holds %d blocks for %d local + %d external tokens", id, len(r.blocks), r.computed, r.external)
		}
		if r.state == Running || r.state == Loading {
			if need := s.blocksFor(r.computed + r.external); len(r.blocks) < need {
				return fmt.Errorf("request %q: %d blocks for %d computed + %d loading tokens", id, len(r.blocks), r.computed, r.external)
			}
			// No over-reservation: at most the blocks of its tokens.
			if len(r.blocks) > s.blocksFor(len(r.tokens)) {
				return fmt.Errorf("request %q holds %d blocks for %d tokens", id, len(r.blocks), len(r.tokens))
			}
		}
		for i, b := range r.blocks {
			if b < 0 || int(b) >= p.Len() {
				return fmt.Errorf("request %q block %d = %d out of range", id, i, b)
			}
			if slices.Contains(r.blocks[:i], b) {
				return fmt.Errorf("request %q holds block %d twice", id, b)
			}
			refs[b]++
			if writer[b] != "" && writer[b] != id {
				return fmt.Errorf("block %d, which %q writes, is also in the table of %q (%v)", b, writer[b], id, r.state)
			}
		}
	}
	if inQueue != len(s.waiting)+len(s.running)+len(s.loading) {
		return fmt.Errorf("queues hold %d requests, %d requests are queued", len(s.waiting)+len(s.running)+len(s.loading), inQueue)
	}
	for b := range refs {
		if refs[b] != p.Refs(BlockID(b)) {
			return fmt.Errorf("block %d: %d references in the pool, %d in request tables", b, p.Refs(BlockID(b)), refs[b])
		}
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
	if conn != nil {
		if err := conn.err(); err != nil {
			return err
		}
		// A block under transfer stays with its request.
		var err error
		conn.inflight(func(id connector.RequestID, blocks []BlockID) bool {
			r := s.reqs[id]
			if r == nil {
				err = fmt.Errorf("request %q has a transfer running but the scheduler forgot it", id)
				return false
			}
			for _, b := range blocks {
				if !slices.Contains(r.blocks, b) || p.Refs(b) <= 0 {
					err = fmt.Errorf("block %d is under a transfer of %q but the request does not hold it (refs %d)", b, id, p.Refs(b))
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
	Blocks []BlockID
}

func snap(s *Scheduler) snapshot {
	sn := snapshot{Step: s.step, InFlight: s.inFlight, Stats: s.Stats(), Ended: len(s.ended), Gen: s.id.Generation}
	for id, r := range s.reqs {
		st, _ := s.Status(id)
		sn.Reqs = append(sn.Reqs, reqSnap{ID: id, Status: st, Tokens: slices.Clone(r.tokens), Blocks: slices.Clone(r.blocks)})
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
