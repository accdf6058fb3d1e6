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

// verify checks that positions [from, upTo) in blocks hold want's values.
func (m *kvMem) verify(blocks []BlockID, want []uint64, from, upTo int) error {
	for p := from; p < upTo; p++ {
		b := blocks[p/m.bs]
		if b == connector.NoBlock {
			return fmt.Errorf("position %d: its entry %d is NoBlock", p, p/m.bs)
		}
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
	g   int
	h   hashing.BlockHash
}

// fakeGroup is what the fake connector knows of a KV cache group.
type fakeGroup struct {
	kind   hashing.GroupKind
	window int
}

// fakeConn is a connector scheduler half over a simulated store. Its
// answers (pending lookups, partial hits, transfers that finish late or
// fail) come from hook functions, random in the state machine test and
// scripted in table tests. It records every breach of the connector
// contract in errs. With KV cache groups it follows the contract's
// resumability rules, as storeconn does: a match ends where every group
// can resume, a load fills exactly what resuming needs, a save skips
// NoBlock entries, and a failed load leaves the local blocks only.
type fakeConn struct {
	bs     int
	groups []fakeGroup
	mems   []*kvMem // per group
	fail   bool     // the load failure policy is "fail"
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
	answered  int                   // lookups answered: Match calls that ended a pending lookup with a number
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
	loads    int // load transfers running
	valid    int // -1, or the tokens valid after the failed loads so far
	saveNext int
	noSave   int // blocks before this belong to an older generation
}

type fakeXfer struct {
	id      uint64
	req     *fakeReq
	load    bool
	group   int
	gen     uint64
	first   int
	blocks  []BlockID
	hashes  []hashing.BlockHash
	shipped bool
	polled  bool // the worker reported it Done in an Output
	failAt  int
}

// newFakeConn returns a fake over the groups of layout l, whose memory is
// mems.
func newFakeConn(l hashing.Layout, mems []*kvMem) *fakeConn {
	c := &fakeConn{
		bs:    l.BlockSize,
		mems:  mems,
		store: make(map[storeKey][]uint64),
		reqs:  make(map[connector.RequestID]*fakeReq),
	}
	for _, g := range l.EffectiveGroups() {
		c.groups = append(c.groups, fakeGroup{kind: g.Kind, window: g.Window})
	}
	return c
}

var _ connector.Planner = (*fakeConn)(nil)
var _ connector.Rotator = (*fakeConn)(nil)

func (c *fakeConn) breach(format string, args ...any) error {
	err := fmt.Errorf("contract breach: "+format, args...)
	c.errs = append(c.errs, err)
	return err
}

func (c *fakeConn) req(id connector.RequestID) *fakeReq {
	q := c.reqs[id]
	if q == nil {
		q = &fakeReq{id: id, lookup: -1, valid: -1}
		c.reqs[id] = q
	}
	return q
}

func (c *fakeConn) plain() bool {
	return len(c.groups) == 1 && c.groups[0].kind == hashing.FullAttention
}

// loadRange returns the first block of group g that a load resuming at
// block p moves, for a request whose first from blocks are local.
func (c *fakeConn) loadRange(g, from, p int) int {
	switch gr := c.groups[g]; gr.kind {
	case hashing.SlidingWindow:
		first := p*c.bs - gr.window + 1
		if first <= 0 {
			return from
		}
		return max(from, first/c.bs)
	case hashing.RecurrentState:
		return p - 1
	}
	return from
}

func (c *fakeConn) has(g int, h hashing.BlockHash) bool {
	_, ok := c.store[storeKey{c.gen, g, h}]
	return ok
}

// resumable reports whether the store holds, in every group, what a
// request with from local blocks needs to resume at block p > from.
func (c *fakeConn) resumable(hashes []hashing.BlockHash, from, p int) bool {
	for g := range c.groups {
		for i := c.loadRange(g, from, p); i < p; i++ {
			if !c.has(g, hashes[i]) {
				return false
			}
		}
	}
	return true
}

// present returns how many blocks from `from` to limit the store can
// resume a request at: the longest resumable point.
func (c *fakeConn) present(hashes []hashing.BlockHash, from, limit int) int {
	for p := limit; p > from; p-- {
		if c.resumable(hashes, from, p) {
			return p - from
		}
	}
	return 0
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
			// A shorter answer still ends where every group resumes.
			for n > 0 && !c.resumable(r.Hashes, from, from+n) {
				n--
			}
		}
		q.lookup = n
		c.answered++
	}
	return connector.Match{Tokens: q.lookup * c.bs}, nil
}

func (c *fakeConn) checkTables(op string, id connector.RequestID, tables [][]connector.BlockID, full int) error {
	if len(tables) != len(c.groups) {
		return c.breach("%s(%q): %d tables for %d groups", op, id, len(tables), len(c.groups))
	}
	for g, t := range tables {
		if c.groups[g].kind != hashing.FullAttention {
			continue
		}
		if len(t) < full {
			return c.breach("%s(%q): %d blocks in group %d for %d blocks", op, id, len(t), g, full)
		}
		if i := slices.Index(t[:full], connector.NoBlock); i >= 0 {
			return c.breach("%s(%q): full-attention group %d has NoBlock at %d", op, id, g, i)
		}
	}
	return nil
}

func (c *fakeConn) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
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
	case q.loads > 0:
		return c.breach("Allocated(%q) twice", r.ID)
	}
	n := external / c.bs
	p := q.from + n
	if err := c.checkTables("Allocated", r.ID, tables, p); err != nil {
		return err
	}
	if !c.resumable(r.Hashes, q.from, p) && !c.plain() {
		return c.breach("Allocated(%q, external %d): the store cannot resume at block %d", r.ID, external, p)
	}
	for g, t := range tables {
		lo := c.loadRange(g, q.from, p)
		if len(t) < p {
			return c.breach("Allocated(%q): %d blocks in group %d for %d external tokens from block %d", r.ID, len(t), g, external, q.from)
		}
		if i := slices.Index(t[lo:p], connector.NoBlock); i >= 0 {
			return c.breach("Allocated(%q): group %d entry %d, which the load fills, is NoBlock", r.ID, g, lo+i)
		}
	}
	c.allocated++
	for g, t := range tables {
		lo := c.loadRange(g, q.from, p)
		if lo >= p {
			continue
		}
		c.nextID++
		x := &fakeXfer{id: c.nextID, req: q, load: true, group: g, gen: c.gen, first: lo,
			blocks: slices.Clone(t[lo:p]), hashes: slices.Clone(r.Hashes[lo:p]), failAt: -1}
		c.xfers = append(c.xfers, x)
		q.loads++
		q.inflight++
	}
	q.valid = -1
	q.saveNext = max(q.saveNext, p)
	return nil
}

func (c *fakeConn) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
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
	if q.loads > 0 {
		return c.breach("Scheduled(%q) while its load runs", r.ID)
	}
	full := min(computed/c.bs, len(r.Hashes))
	if err := c.checkTables("Scheduled", r.ID, tables, full); err != nil {
		return err
	}
	for g, t := range tables {
		if c.bs*len(t) < computed {
			return c.breach("Scheduled(%q): %d blocks in group %d for %d tokens", r.ID, len(t), g, computed)
		}
	}
	start := max(q.saveNext, q.noSave)
	for g, t := range tables {
		var x *fakeXfer
		for i := start; i < full; i++ {
			if t[i] == connector.NoBlock {
				x = nil
				continue
			}
			if x == nil {
				c.nextID++
				x = &fakeXfer{id: c.nextID, req: q, group: g, gen: c.gen, first: i, failAt: -1}
				c.xfers = append(c.xfers, x)
				q.inflight++
			}
			x.blocks = append(x.blocks, t[i])
			x.hashes = append(x.hashes, r.Hashes[i])
		}
	}
	q.saveNext = max(q.saveNext, full)
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
		t := connector.Transfer{ID: x.id, Req: x.req.id, Group: x.group, First: x.first, Blocks: x.blocks, Hashes: x.hashes}
		if x.load {
			c.meta.Loads = append(c.meta.Loads, t)
		} else {
			c.meta.Saves = append(c.meta.Saves, t)
		}
	}
	return &c.meta
}

// poll is the worker's side: it reports Done the shipped transfers the
// done hook picks, as one worker's Output (the fake's layouts have one
// rank). Update finishes exactly those.
func (c *fakeConn) poll() *connector.Output {
	out := &connector.Output{}
	for _, x := range c.xfers {
		if x.shipped && !x.polled && (c.done == nil || c.done(x)) {
			x.polled = true
			out.Done = append(out.Done, x.id)
		}
	}
	return out
}

// Update finishes the transfers the Outputs report Done (without Outputs,
// the shipped ones the done hook picks): a save copies its blocks' content
// (as it is now) into the store; a load copies stored content into its
// blocks, up to the first failing block, and poisons the failing one.
func (c *fakeConn) Update(outs []*connector.Output) (*connector.Progress, error) {
	if err := c.inject["Update"]; err != nil {
		return nil, err
	}
	if !c.inStep {
		return nil, c.breach("Update without Plan")
	}
	var reported map[uint64]bool
	if outs != nil {
		reported = map[uint64]bool{}
		for _, o := range outs {
			for _, id := range o.Done {
				if !slices.ContainsFunc(c.xfers, func(x *fakeXfer) bool { return x.id == id && x.polled }) {
					return nil, c.breach("Update: an Output reports transfer %d, which no worker ran", id)
				}
				reported[id] = true
			}
		}
	}
	c.inStep = false
	c.stepMatch = c.stepMatch[:0]
	c.prog.Loaded = c.prog.Loaded[:0]
	c.prog.Failed = c.prog.Failed[:0]
	c.prog.Released = c.prog.Released[:0]
	kept := c.xfers[:0]
	for _, x := range c.xfers {
		finished := reported[x.id]
		if reported == nil {
			finished = x.shipped && (c.done == nil || c.done(x))
		}
		if !finished {
			kept = append(kept, x)
			continue
		}
		q := x.req
		mem := c.mems[x.group]
		if x.load {
			fail := -1
			if c.failAt != nil {
				fail = c.failAt(x)
			}
			for i, b := range x.blocks {
				v, ok := c.store[storeKey{x.gen, x.group, x.hashes[i]}]
				if i == fail || !ok {
					if fail < 0 || i < fail {
						fail = i
					}
					mem.vals[b][0] = poison
					continue
				}
				copy(mem.vals[b], v)
			}
			if fail >= 0 {
				valid := q.from * c.bs // a window or a state is no use without the rest
				if c.plain() {
					valid = (x.first + fail) * c.bs
				}
				if q.valid < 0 || valid < q.valid {
					q.valid = valid
				}
			}
			if q.loads--; q.loads == 0 {
				q.lookup = -1
				if q.valid >= 0 {
					c.prog.Failed = append(c.prog.Failed, connector.LoadFailure{Req: q.id, Valid: q.valid, Fail: c.fail})
				} else {
					c.prog.Loaded = append(c.prog.Loaded, q.id)
				}
			}
		} else {
			for i, b := range x.blocks {
				k := storeKey{x.gen, x.group, x.hashes[i]}
				if _, ok := c.store[k]; !ok {
					c.store[k] = slices.Clone(mem.vals[b])
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
		if x.req != q {
			continue
		}
		for i, b := range x.blocks {
			j := x.first + i
			var got BlockID = connector.NoBlock
			if x.group < len(tables) && j < len(tables[x.group]) {
				got = tables[x.group][j]
			}
			// A sliding-window block may have left the table (the engine
			// holds it until the release); any other block must be there.
			if got != b && (got != connector.NoBlock || c.groups[x.group].kind == hashing.FullAttention) {
				c.breach("Finish(%q): group %d entry %d is %d, but transfer %d (index %d) moves block %d", r.ID, x.group, j, got, x.id, i, b)
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

// inflight returns, for every transfer not yet finished, its request,
// group and blocks.
func (c *fakeConn) inflight(yield func(id connector.RequestID, g int, blocks []BlockID) bool) {
	for _, x := range c.xfers {
		if !yield(x.req.id, x.group, x.blocks) {
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
	return p.c.Allocated(r, external, tables...)
}
func (p plainConn) Scheduled(r *connector.Request, computed int, tables ...[]connector.BlockID) error {
	return p.c.Scheduled(r, computed, tables...)
}
func (p plainConn) Plan() *connector.Metadata { return p.c.Plan() }
func (p plainConn) Update(outs []*connector.Output) (*connector.Progress, error) {
	return p.c.Update(outs)
}
func (p plainConn) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	return p.c.Finish(r, tables...)
}
func (p plainConn) Close() error { return p.c.Close() }

// warm stores the blocks of tokens (with salt) as another engine would have
// computed them, in generation gen: in every group, every block (for a
// state group, the state at its end).
func (c *fakeConn) warm(gen uint64, salt string, tokens []hashing.Token) {
	mr := modelReq{salt: salt}
	hashes, err := hashing.HashBlocks(c.bs, tokens, mr.extras()...)
	if err != nil {
		panic(err)
	}
	d := prefixDigests(nil, salt, tokens)
	for g, gr := range c.groups {
		for i, h := range hashes {
			v := d[i*c.bs : (i+1)*c.bs]
			if gr.kind == hashing.RecurrentState {
				v = d[(i+1)*c.bs-1:][:1]
			}
			c.store[storeKey{gen, g, h}] = slices.Clone(v)
		}
	}
}
