package scheduler

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// kvMem simulates the engine's KV memory: one value per token position of
// each block. The value of position p of a request is the prefix digest of
// its extras and tokens [0, p], so that a block whose content came from the
// wrong place (another prefix, a stale load, a block reused while a
// transfer read it) is caught when a later step attends to it.
type kvMem struct {
	bs   int
	vals [][]uint64
}

func newKVMem(blocks, bs int) *kvMem {
	m := &kvMem{bs: bs, vals: make([][]uint64, blocks)}
	for i := range m.vals {
		m.vals[i] = make([]uint64, bs)
	}
	return m
}

// poison marks a value no prefix digest takes.
const poison = 0

// prefixDigests returns the digest of every prefix of tokens, seeded by salt.
func prefixDigests(dst []uint64, salt string, tokens []hashing.Token) []uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * 1099511628211
	}
	h = (h ^ 0xff) * 1099511628211
	dst = dst[:0]
	for _, t := range tokens {
		h = (h ^ uint64(t)) * 1099511628211
		h ^= h >> 29
		v := h | 1 // never poison
		dst = append(dst, v)
	}
	return dst
}

// verify checks that positions [0, upTo) in blocks hold want's values.
func (m *kvMem) verify(blocks []BlockID, want []uint64, upTo int) error {
	for p := 0; p < upTo; p++ {
		b := blocks[p/m.bs]
		if got := m.vals[b][p%m.bs]; got != want[p] {
			return fmt.Errorf("position %d in block %d holds %#x, want %#x", p, b, got, want[p])
		}
	}
	return nil
}

// write stores want's values of positions [from, to) into blocks.
func (m *kvMem) write(blocks []BlockID, want []uint64, from, to int) {
	for p := from; p < to; p++ {
		m.vals[blocks[p/m.bs]][p%m.bs] = want[p]
	}
}

type storeKey struct {
	gen uint64
	h   hashing.BlockHash
}

// fakeConn is a connector scheduler half over a simulated store. Its
// answers (pending lookups, partial hits, transfers that finish late or
// fail) come from hook functions, random in the state machine test and
// scripted in table tests. It records every breach of the connector
// contract in errs.
type fakeConn struct {
	bs     int
	mem    *kvMem
	fail   bool // the load failure policy is "fail"
	gen    uint64
	store  map[storeKey][]uint64
	reqs   map[connector.RequestID]*fakeReq
	xfers  []*fakeXfer // planned or running, in planned order
	nextID uint64
	meta   connector.Metadata
	prog   connector.Progress
	step   uint64
	inStep bool // Plan was called, Update not yet
	frozen bool // the engine detached the connector: no Match, Allocated or Scheduled

	// Hooks; nil means: answer at once, the whole stored prefix, every
	// transfer finishes at the next Update, no failure.
	pending func(id connector.RequestID) bool
	hit     func(id connector.RequestID, present int) int // blocks of the present ones to answer
	done    func(x *fakeXfer) bool
	failAt  func(x *fakeXfer) int // -1 or the first failing block of a load

	inject    map[string]error      // method name -> error it returns, with no effect
	matches   int                   // Match calls
	stepMatch []connector.RequestID // requests matched since the last Update
	finishes  int
	allocated int // Allocated calls with external > 0
	errs      []error
}

type fakeReq struct {
	id       connector.RequestID
	lookup   int // -1: none; -2: pending; else blocks present from `from`
	from     int
	finished bool
	inflight int
	load     *fakeXfer
	saveNext int
	noSave   int // blocks before this belong to an older generation
}

type fakeXfer struct {
	id      uint64
	req     *fakeReq
	load    bool
	gen     uint64
	first   int
	blocks  []BlockID
	hashes  []hashing.BlockHash
	shipped bool
	failAt  int
}

func newFakeConn(bs int, mem *kvMem) *fakeConn {
	return &fakeConn{
		bs:    bs,
		mem:   mem,
		store: make(map[storeKey][]uint64),
		reqs:  make(map[connector.RequestID]*fakeReq),
	}
}

var _ connector.Scheduler = (*fakeConn)(nil)
var _ connector.Rotator = (*fakeConn)(nil)

func (c *fakeConn) breach(format string, args ...any) error {
	err := fmt.Errorf("contract breach: "+format, args...)
	c.errs = append(c.errs, err)
	return err
}

func (c *fakeConn) req(id connector.RequestID) *fakeReq {
	q := c.reqs[id]
	if q == nil {
		q = &fakeReq{id: id, lookup: -1}
		c.reqs[id] = q
	}
	return q
}

// present counts the blocks of hashes, from `from` to limit, that the
// store holds in the current generation.
func (c *fakeConn) present(hashes []hashing.BlockHash, from, limit int) int {
	n := 0
	for i := from; i < limit; i++ {
		if _, ok := c.store[storeKey{c.gen, hashes[i]}]; !ok {
			break
		}
		n++
	}
	return n
}

func (c *fakeConn) Match(r *connector.Request, computed int) (connector.Match, error) {
	if err := c.inject["Match"]; err != nil {
		return connector.Match{}, err
	}
	c.matches++
	c.stepMatch = append(c.stepMatch, r.ID)
	if c.frozen {
		return connector.Match{}, c.breach("Match(%q) after the engine detached the connector", r.ID)
	}
	if c.inStep {
		return connector.Match{}, c.breach("Match(%q) between Plan and Update", r.ID)
	}
	if computed%c.bs != 0 || computed < 0 {
		return connector.Match{}, c.breach("Match(%q, computed %d) not whole blocks", r.ID, computed)
	}
	if r.Prompt/c.bs > len(r.Hashes) {
		return connector.Match{}, c.breach("Match(%q): %d hashes for %d tokens", r.ID, len(r.Hashes), r.Prompt)
	}
	q := c.req(r.ID)
	if q.finished {
		return connector.Match{}, c.breach("Match(%q) after Finish and before release", r.ID)
	}
	from := computed / c.bs
	limit := min((r.Prompt-1)/c.bs, len(r.Hashes))
	q.saveNext = max(q.saveNext, from)
	if from >= limit {
		return connector.Match{}, nil
	}
	if q.lookup == -1 || q.from != from {
		q.lookup, q.from = -2, from
	}
	if q.lookup == -2 {
		if c.pending != nil && c.pending(r.ID) {
			return connector.Match{Pending: true}, nil
		}
		n := c.present(r.Hashes, from, limit)
		if c.hit != nil {
			n = c.hit(r.ID, n)
		}
		q.lookup = n
	}
	return connector.Match{Tokens: q.lookup * c.bs}, nil
}

func (c *fakeConn) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
	blocks := connector.Table(tables, 0)
	if err := c.inject["Allocated"]; err != nil {
		return err
	}
	q := c.reqs[r.ID]
	switch {
	case c.frozen:
		return c.breach("Allocated(%q) after the engine detached the connector", r.ID)
	case c.inStep:
		return c.breach("Allocated(%q) between Plan and Update", r.ID)
	case q == nil:
		return c.breach("Allocated(%q) before Match", r.ID)
	case q.finished:
		return c.breach("Allocated(%q) after Finish", r.ID)
	case external == 0:
		return nil
	case q.lookup < 0 || external != external/c.bs*c.bs || external/c.bs > q.lookup:
		return c.breach("Allocated(%q, external %d) beyond the match of %d blocks", r.ID, external, q.lookup)
	case q.from+external/c.bs > len(blocks):
		return c.breach("Allocated(%q): %d blocks for %d external tokens from block %d", r.ID, len(blocks), external, q.from)
	case q.load != nil:
		return c.breach("Allocated(%q) twice", r.ID)
	}
	n := external / c.bs
	c.allocated++
	c.nextID++
	x := &fakeXfer{id: c.nextID, req: q, load: true, gen: c.gen, first: q.from,
		blocks: slices.Clone(blocks[q.from : q.from+n]), hashes: slices.Clone(r.Hashes[q.from : q.from+n]), failAt: -1}
	c.xfers = append(c.xfers, x)
	q.load = x
	q.inflight++
	q.saveNext = max(q.saveNext, q.from+n)
	return nil
}

func (c *fakeConn) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
	blocks := connector.Table(tables, 0)
	if err := c.inject["Scheduled"]; err != nil {
		return err
	}
	if c.frozen {
		return c.breach("Scheduled(%q) after the engine detached the connector", r.ID)
	}
	if c.inStep {
		return c.breach("Scheduled(%q) between Plan and Update", r.ID)
	}
	q := c.req(r.ID)
	if q.finished {
		return c.breach("Scheduled(%q) after Finish", r.ID)
	}
	if q.load != nil {
		return c.breach("Scheduled(%q) while its load runs", r.ID)
	}
	full := min(computed/c.bs, len(r.Hashes))
	if c.bs*len(blocks) < computed {
		return c.breach("Scheduled(%q): %d blocks for %d tokens", r.ID, len(blocks), computed)
	}
	start := max(q.saveNext, q.noSave)
	if start < full {
		c.nextID++
		x := &fakeXfer{id: c.nextID, req: q, gen: c.gen, first: start,
			blocks: slices.Clone(blocks[start:full]), hashes: slices.Clone(r.Hashes[start:full]), failAt: -1}
		c.xfers = append(c.xfers, x)
		q.inflight++
		q.saveNext = full
	}
	return nil
}

func (c *fakeConn) Plan() *connector.Metadata {
	if c.inStep {
		c.breach("Plan twice without Update")
	}
	c.inStep = true
	c.step++
	c.meta.Reset()
	c.meta.Step, c.meta.Generation = c.step, c.gen
	for _, x := range c.xfers {
		if x.shipped {
			continue
		}
		x.shipped = true
		t := connector.Transfer{ID: x.id, Req: x.req.id, First: x.first, Blocks: x.blocks, Hashes: x.hashes}
		if x.load {
			c.meta.Loads = append(c.meta.Loads, t)
		} else {
			c.meta.Saves = append(c.meta.Saves, t)
		}
	}
	return &c.meta
}

// Update finishes the shipped transfers the done hook picks: a save copies
// its blocks' content (as it is now) into the store; a load copies stored
// content into its blocks, up to the first failing block, and poisons the
// failing one.
func (c *fakeConn) Update(outs []*connector.Output) (*connector.Progress, error) {
	if err := c.inject["Update"]; err != nil {
		return nil, err
	}
	if !c.inStep {
		return nil, c.breach("Update without Plan")
	}
	c.inStep = false
	c.stepMatch = c.stepMatch[:0]
	c.prog.Loaded = c.prog.Loaded[:0]
	c.prog.Failed = c.prog.Failed[:0]
	c.prog.Released = c.prog.Released[:0]
	kept := c.xfers[:0]
	for _, x := range c.xfers {
		if !x.shipped || (c.done != nil && !c.done(x)) {
			kept = append(kept, x)
			continue
		}
		q := x.req
		if x.load {
			fail := -1
			if c.failAt != nil {
				fail = c.failAt(x)
			}
			for i, b := range x.blocks {
				v, ok := c.store[storeKey{x.gen, x.hashes[i]}]
				if i == fail || !ok {
					if fail < 0 || i < fail {
						fail = i
					}
					c.mem.vals[b][0] = poison
					continue
				}
				copy(c.mem.vals[b], v)
			}
			q.load = nil
			q.lookup = -1
			if fail >= 0 {
				c.prog.Failed = append(c.prog.Failed, connector.LoadFailure{Req: q.id, Valid: (x.first + fail) * c.bs, Fail: c.fail})
			} else {
				c.prog.Loaded = append(c.prog.Loaded, q.id)
			}
		} else {
			for i, b := range x.blocks {
				k := storeKey{x.gen, x.hashes[i]}
				if _, ok := c.store[k]; !ok {
					c.store[k] = slices.Clone(c.mem.vals[b])
				}
			}
		}
		q.inflight--
		if q.finished && q.inflight == 0 {
			delete(c.reqs, q.id)
			c.prog.Released = append(c.prog.Released, q.id)
		}
	}
	clear(c.xfers[len(kept):])
	c.xfers = kept
	return &c.prog, nil
}

func (c *fakeConn) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	blocks := connector.Table(tables, 0)
	if err := c.inject["Finish"]; err != nil {
		return false, err
	}
	c.finishes++
	q := c.reqs[r.ID]
	switch {
	case q == nil:
		return false, fmt.Errorf("%w: Finish(%q)", connector.ErrUnknownRequest, r.ID)
	case q.finished:
		return false, c.breach("Finish(%q) twice", r.ID)
	}
	for _, x := range c.xfers {
		if x.req == q {
			for i, b := range x.blocks {
				if !slices.Contains(blocks, b) {
					c.breach("Finish(%q) without block %d of transfer %d (index %d)", r.ID, b, x.id, i)
				}
			}
		}
	}
	if q.inflight == 0 {
		delete(c.reqs, r.ID)
		return false, nil
	}
	q.finished = true
	return true, nil
}

func (c *fakeConn) Rotate(gen uint64) error {
	if err := c.inject["Rotate"]; err != nil {
		return err
	}
	if c.inStep {
		return c.breach("Rotate between Plan and Update")
	}
	c.gen = gen
	for _, q := range c.reqs {
		q.lookup = -1
		q.noSave = max(q.noSave, q.saveNext)
	}
	return nil
}

func (c *fakeConn) Close() error { return nil }

// inflight returns, for every transfer not yet finished, its request and
// blocks.
func (c *fakeConn) inflight(yield func(id connector.RequestID, blocks []BlockID) bool) {
	for _, x := range c.xfers {
		if !yield(x.req.id, x.blocks) {
			return
		}
	}
}

func (c *fakeConn) err() error { return errors.Join(c.errs...) }

// plainConn hides the fake's optional interfaces: a connector without
// Rotator.
type plainConn struct{ c *fakeConn }

func (p plainConn) Match(r *connector.Request, computed int) (connector.Match, error) {
	return p.c.Match(r, computed)
}
func (p plainConn) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
	blocks := connector.Table(tables, 0)
	return p.c.Allocated(r, external, blocks)
}
func (p plainConn) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
	blocks := connector.Table(tables, 0)
	return p.c.Scheduled(r, computed, blocks)
}
func (p plainConn) Plan() *connector.Metadata { return p.c.Plan() }
func (p plainConn) Update(outs []*connector.Output) (*connector.Progress, error) {
	return p.c.Update(outs)
}
func (p plainConn) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	blocks := connector.Table(tables, 0)
	return p.c.Finish(r, blocks)
}
func (p plainConn) Close() error { return p.c.Close() }

// warm stores the blocks of tokens (with salt) as another engine would have
// computed them, in generation gen.
func (c *fakeConn) warm(gen uint64, salt string, tokens []hashing.Token) {
	mr := modelReq{salt: salt}
	hashes, err := hashing.HashBlocks(c.bs, tokens, mr.extras()...)
	if err != nil {
		panic(err)
	}
	d := prefixDigests(nil, salt, tokens)
	for i, h := range hashes {
		c.store[storeKey{gen, h}] = d[i*c.bs : (i+1)*c.bs]
	}
}
