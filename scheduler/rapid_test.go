package scheduler

import (
	"errors"
	"flag"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// machine is the state machine test of the pool and the tracker: a
// scheduler driven by random engine calls, over a fake connector whose
// answers are random too (pending lookups, partial hits, failed loads,
// slow saves), with the invariants checked after every action.
type machine struct {
	h        *harness
	t        *rapid.T // the action being run: the connector's hooks draw from it
	cfg      Config
	ids      []connector.RequestID
	inFlight bool
	plan     *Plan
	rollback map[connector.RequestID]int // a rolled-back request's next item starts here
	// The blocks of a request as a load failure left them: the ones before
	// Valid must not be recomputed, so they stay.
	kept map[connector.RequestID][][]BlockID
	// Blocks a rolled-back request still holds beyond its computed tokens
	// (allocated for the load): the only blocks a request may hold beyond
	// those of its current item.
	excess map[connector.RequestID]int
	kind   int // noConn, withConn or withPlainConn
}

func newMachine(t *rapid.T, mut mutation) *machine {
	bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize")
	cfg := Config{
		Identity:         testIdentity(bs),
		Blocks:           rapid.IntRange(3, 40).Draw(t, "blocks"),
		MaxBatchedTokens: rapid.IntRange(1, 24).Draw(t, "budget"),
		MaxRunning:       rapid.IntRange(0, 5).Draw(t, "maxRunning"),
		PrefixCaching:    rapid.Bool().Draw(t, "prefixCaching"),
		ExternalLookup:   rapid.SampledFrom([]Lookup{LookupAuto, LookupAlways, LookupAlways, LookupNever}).Draw(t, "lookup"),
	}
	// Half the runs have KV cache groups: a hybrid model's full
	// attention, sliding window and recurrent state, or some of them,
	// each group with a pool of its own size.
	full, swa, state := hashing.FullAttention, hashing.SlidingWindow, hashing.RecurrentState
	if kinds := rapid.SampledFrom([][]hashing.GroupKind{nil, nil, nil, {full, swa, state}, {full, swa, state}, {full, swa}, {full, state}, {swa, state}}).Draw(t, "groups"); kinds != nil {
		cfg.Identity = hybridIdentity(bs, rapid.IntRange(1, 3*bs+1).Draw(t, "window"), kinds...)
		if slices.Contains(kinds, state) {
			cfg.MaxBatchedTokens = max(cfg.MaxBatchedTokens, bs)
		}
		cfg.GroupBlocks = make([]int, len(kinds))
		for g, k := range kinds {
			cfg.GroupBlocks[g] = cfg.Blocks
			if k != full {
				least := cfg.leastBlocks(cfg.Identity.Layout.Groups[g])
				cfg.GroupBlocks[g] = rapid.IntRange(least, least+30).Draw(t, "groupBlocks")
			}
		}
		cfg.Blocks = 0
	}
	kind := rapid.SampledFrom([]int{noConn, withConn, withConn, withConn, withPlainConn}).Draw(t, "conn")
	m := &machine{cfg: cfg, rollback: map[connector.RequestID]int{}, kept: map[connector.RequestID][][]BlockID{}, excess: map[connector.RequestID]int{}}
	m.h = newHarness(t, cfg, kind)
	m.kind = kind
	m.h.s.mut = mut
	m.t = t
	if c := m.h.conn; c != nil {
		c.fail = rapid.IntRange(0, 2).Draw(t, "policyFail") == 0
		c.pending = func(connector.RequestID) bool { return rapid.IntRange(0, 2).Draw(m.t, "pending") == 0 }
		c.hit = func(_ connector.RequestID, present int) int {
			if rapid.IntRange(0, 3).Draw(m.t, "partial") > 0 {
				return present
			}
			return rapid.IntRange(0, present).Draw(m.t, "hit")
		}
		c.done = func(*fakeXfer) bool { return rapid.IntRange(0, 2).Draw(m.t, "xferDone") > 0 }
		c.failAt = func(x *fakeXfer) int { return rapid.IntRange(-4, len(x.blocks)-1).Draw(m.t, "failAt") }
		if rapid.Bool().Draw(t, "warmStore") {
			// Another engine computed the base prompts: the store holds
			// their blocks from the start.
			for _, base := range bases {
				c.warm(0, "", base)
				c.warm(0, "s", base)
			}
		}
	}
	return m
}

func (m *machine) check(t *rapid.T) {
	if err := m.h.check(); err != nil {
		t.Fatal(err)
	}
	if !m.inFlight {
		if err := m.h.settled(); err != nil {
			t.Fatal(err)
		}
	}
}

// unchanged runs f, which must fail with an error wrapping want and naming
// mention, and checks that the scheduler's state did not change.
func (m *machine) unchanged(t *rapid.T, want error, mention string, f func() error) {
	before := snap(m.h.s)
	err := f()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
	if mention != "" && !strings.Contains(err.Error(), mention) {
		t.Fatalf("error %q does not name %q", err, mention)
	}
	if diff := cmp.Diff(before, snap(m.h.s)); diff != "" {
		t.Fatalf("a rejected call changed the state (-before +after):\n%s", diff)
	}
}

var bases = [][]hashing.Token{seq(100, 24), seq(200, 24)}

func (m *machine) Add(t *rapid.T) {
	m.t = t
	if len(m.ids) > 0 && rapid.IntRange(0, 9).Draw(t, "dupAdd") == 0 {
		id := rapid.SampledFrom(m.ids).Draw(t, "dupID")
		if _, known := m.h.s.reqs[id]; known {
			m.unchanged(t, ErrDuplicateRequest, string(id), func() error {
				return m.h.s.Add(Request{ID: id, Prompt: seq(1, 1)})
			})
			return
		}
	}
	id := connector.RequestID("r" + strconv.Itoa(len(m.ids)))
	// Prompts share prefixes often, so that blocks hit in the local cache
	// and in the store.
	base := bases[rapid.SampledFrom([]int{0, 0, 0, 1}).Draw(t, "base")]
	n := rapid.SampledFrom([]int{0, 3, 8, 12, 16, 16, 17, 24, 24}).Draw(t, "shared")
	prompt := slices.Clone(base[:n])
	prompt = append(prompt, rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 6).Draw(t, "suffix")...)
	if len(prompt) == 0 {
		prompt = append(prompt, 7)
	}
	salt := rapid.SampledFrom([]string{"", "", "", "", "", "s"}).Draw(t, "salt")
	maxGen := rapid.IntRange(1, 6).Draw(t, "maxGen")
	if m.h.s.fitsPools(len(prompt)) != nil {
		m.unchanged(t, ErrTooLarge, string(id), func() error { return m.h.add(string(id), salt, prompt, maxGen) })
		return
	}
	if err := m.h.add(string(id), salt, prompt, maxGen); err != nil {
		t.Fatalf("Add(%q): %v", id, err)
	}
	m.ids = append(m.ids, id)
}

func (m *machine) Step(t *rapid.T) {
	m.t = t
	if m.inFlight {
		m.unchanged(t, ErrStepInFlight, "Step", func() error { _, err := m.h.s.Step(); return err })
		return
	}
	idle, answered := m.h.s.Idle(), 0
	if m.h.conn != nil {
		answered = m.h.conn.answered
	}
	p, err := m.h.s.Step()
	if err != nil {
		t.Fatalf("Step: %v", err)
	}
	// Idle promises that only news from outside makes a request
	// runnable: here, a lookup that answered in this step.
	if idle && len(p.Items) > 0 && (m.h.conn == nil || m.h.conn.answered == answered) {
		t.Fatalf("Idle() was true, but step %d plans %d items (%v) with no lookup answered", p.Step, len(p.Items), spans(p))
	}
	if err := m.h.compute(p); err != nil {
		t.Fatal(err)
	}
	m.inFlight, m.plan = true, p
	for id := range m.excess {
		if st, err := m.h.s.Status(id); err != nil || st.State != Running {
			delete(m.excess, id)
		}
	}
	for _, id := range p.Preempted {
		// Preempted in this step (and maybe admitted again in it, from
		// the local cache): no longer a rolled-back request.
		delete(m.rollback, id)
		delete(m.kept, id)
	}
	for _, it := range p.Items {
		// No over-reservation: a request holds the blocks of the
		// positions it computed and computes now, no more.
		for g, tab := range it.Tables {
			if n := len(tab); n > max(m.h.s.blocksFor(it.End), m.excess[it.ID]) {
				t.Fatalf("request %q computes [%d, %d) with %d blocks in group %d", it.ID, it.Start, it.End, n, g)
			}
		}
		if v, ok := m.rollback[it.ID]; ok {
			// A rolled-back request recomputes exactly the failed
			// blocks and those after: from Valid on, with the blocks
			// before it untouched.
			if it.Start != v {
				t.Fatalf("request %q rolled back to %d tokens computes from %d", it.ID, v, it.Start)
			}
			for g, kb := range m.kept[it.ID] {
				if !slices.Equal(it.Tables[g][:len(kb)], kb) {
					t.Fatalf("request %q rolled back to %d tokens: blocks %v of group %d, were %v", it.ID, v, it.Tables[g], g, kb)
				}
			}
			delete(m.rollback, it.ID)
			delete(m.kept, it.ID)
		}
	}
	for id := range m.rollback {
		if st, err := m.h.s.Status(id); err != nil || st.State != Running {
			delete(m.rollback, id) // preempted or ended before running again
			delete(m.kept, id)
		}
	}
	if c := m.h.conn; c != nil && m.h.s.lookups() {
		m.checkNotBlocked(t, p)
	}
	if m.h.conn != nil && m.cfg.ExternalLookup == LookupAuto && !m.cfg.PrefixCaching && m.h.conn.matches > 0 {
		t.Fatalf("prefix caching off: %d lookups", m.h.conn.matches)
	}
	if m.h.conn != nil && m.cfg.ExternalLookup == LookupNever && m.h.conn.matches > 0 {
		t.Fatalf("lookup never: %d lookups", m.h.conn.matches)
	}
}

// StepDone runs a whole step.
func (m *machine) StepDone(t *rapid.T) {
	if m.inFlight {
		m.Done(t)
	}
	m.Step(t)
	m.Done(t)
}

// checkNotBlocked checks, after a Step, that admission went through the
// waiting queue in order and stopped only where it had to: at the end of
// the token budget or of MaxRunning, or at a request that did not fit. A
// request whose lookup is pending never stops it.
func (m *machine) checkNotBlocked(t *rapid.T, p *Plan) {
	s := m.h.s
	budget := m.cfg.MaxBatchedTokens
	for _, it := range p.Items {
		budget -= it.End - it.Start
	}
	if budget <= 0 || m.cfg.MaxRunning > 0 && len(s.running)+len(s.loading) >= m.cfg.MaxRunning {
		return
	}
	for _, r := range s.running {
		if r.planned != p.Step {
			return // a running request waits for blocks: no admission
		}
	}
	matched := m.h.conn.stepMatch
	for i, r := range s.waiting {
		if slices.Contains(matched, r.id) {
			continue
		}
		// r was not examined: the one before it must be a request that
		// did not fit, not a pending lookup.
		if i == 0 || s.waiting[i-1].state != Waiting {
			prev := "none"
			if i > 0 {
				prev = string(s.waiting[i-1].id) + " " + s.waiting[i-1].state.String()
			}
			t.Fatalf("step %d: waiting request %q was not looked at with %d tokens of budget left; before it: %s; plan %+v running %d loading %d matched %v stats %+v", p.Step, r.id, budget, prev, spans(p), len(s.running), len(s.loading), matched, s.Stats())
		}
		return
	}
}

func (m *machine) Done(t *rapid.T) {
	m.t = t
	if !m.inFlight {
		m.unchanged(t, ErrNoStep, "", func() error { return m.h.s.Done(nil, nil) })
		return
	}
	var res []Result
	for _, it := range m.plan.Items {
		if it.Sample {
			mr := m.h.reqs[it.ID]
			fin := mr.gen+1 >= mr.maxGen || rapid.IntRange(0, 5).Draw(t, "eos") == 0
			res = append(res, Result{ID: it.ID, Token: nextToken(mr.digests[it.End-1]), Finished: fin})
		}
	}
	// Any order.
	if len(res) > 1 && rapid.Bool().Draw(t, "shuffle") {
		slices.Reverse(res)
	}
	loading := map[connector.RequestID]bool{}
	for _, r := range m.h.s.loading {
		loading[r.id] = true
	}
	if err := m.h.s.Done(res, m.h.outs()); err != nil {
		t.Fatalf("Done: %v", err)
	}
	m.inFlight = false
	m.h.apply(res)
	if c := m.h.conn; c != nil {
		for _, f := range c.prog.Failed {
			if !loading[f.Req] {
				continue // preempted or ended while loading: ignored
			}
			st, err := m.h.s.Status(f.Req)
			if f.Fail {
				if err == nil && !st.State.Ended() {
					t.Fatalf("request %q failed to load under policy fail but is %v", f.Req, st.State)
				}
				continue
			}
			if err != nil || st.State != Running {
				t.Fatalf("request %q rolled back after a failed load is %v (%v)", f.Req, st.State, err)
			}
			if st.Computed != f.Valid {
				t.Fatalf("request %q rolled back to %d tokens, want Valid = %d", f.Req, st.Computed, f.Valid)
			}
			m.rollback[f.Req] = f.Valid
			r := m.h.s.reqs[f.Req]
			var kept [][]BlockID
			for _, t := range r.tabs {
				m.excess[f.Req] = max(m.excess[f.Req], len(t))
				kept = append(kept, slices.Clone(t[:min(len(t), f.Valid/m.cfg.Identity.Layout.BlockSize)]))
			}
			m.kept[f.Req] = kept
		}
	}
}

func (m *machine) Abort(t *rapid.T) {
	m.t = t
	id := connector.RequestID("never-added")
	if len(m.ids) > 0 && rapid.IntRange(0, 5).Draw(t, "abortKnown") > 0 {
		id = rapid.SampledFrom(m.ids).Draw(t, "abortID")
	}
	if m.inFlight {
		m.unchanged(t, ErrStepInFlight, string(id), func() error { return m.h.s.Abort(id) })
		return
	}
	mr := m.h.reqs[id]
	switch {
	case mr == nil:
		m.unchanged(t, ErrUnknownRequest, string(id), func() error { return m.h.s.Abort(id) })
	case mr.ended:
		before := snap(m.h.s)
		err := m.h.s.Abort(id) // double finish
		if !errors.Is(err, ErrEnded) && !errors.Is(err, ErrUnknownRequest) || !strings.Contains(err.Error(), string(id)) {
			t.Fatalf("Abort(%q) of an ended request: %v", id, err)
		}
		if diff := cmp.Diff(before, snap(m.h.s)); diff != "" {
			t.Fatalf("a rejected Abort changed the state:\n%s", diff)
		}
	default:
		if err := m.h.s.Abort(id); err != nil {
			t.Fatalf("Abort(%q): %v", id, err)
		}
		m.h.apply(nil)
		if !mr.ended {
			t.Fatalf("Abort(%q) reported no Ended", id)
		}
	}
}

func (m *machine) Invalidate(t *rapid.T) {
	m.t = t
	s := m.h.s
	gen := s.Generation() + 1
	if m.inFlight {
		m.unchanged(t, ErrStepInFlight, strconv.FormatUint(gen, 10), func() error { return s.Invalidate(gen) })
		return
	}
	if rapid.IntRange(0, 3).Draw(t, "staleGen") == 0 {
		old := s.Generation()
		m.unchanged(t, ErrGeneration, strconv.FormatUint(old, 10), func() error { return s.Invalidate(old) })
		return
	}
	oldNS := s.Namespace()
	if err := s.Invalidate(gen); err != nil {
		t.Fatalf("Invalidate(%d): %v", gen, err)
	}
	clear(m.rollback)
	clear(m.kept)
	clear(m.excess)
	st := s.Stats()
	if st.Running != 0 || st.Loading != 0 || st.Pool.Cached != 0 || st.Pool.Indexed != 0 {
		t.Fatalf("after Invalidate: %d running, %d loading, %d cached, %d indexed", st.Running, st.Loading, st.Pool.Cached, st.Pool.Indexed)
	}
	switch c := m.h.conn; {
	case c == nil:
	case m.kind == withPlainConn:
		// Without Rotator the connector is detached: nothing more is
		// looked up or saved under the old generation.
		c.frozen = true
	case c.gen != gen:
		t.Fatalf("connector at generation %d after Invalidate(%d)", c.gen, gen)
	}
	// No block of the old generation hits, in either namespace.
	for _, r := range s.reqs {
		for _, ns := range []hashing.Namespace{oldNS, s.Namespace()} {
			for g, pool := range s.pools {
				for _, h := range r.hashes() {
					if b, ok := pool.find(ns, h); ok {
						t.Fatalf("request %q hits block %d of group %d after Invalidate", r.id, b, g)
					}
				}
			}
		}
	}
}

func (m *machine) BadDone(t *rapid.T) {
	m.t = t
	if !m.inFlight {
		t.Skip("no step in flight")
	}
	var res []Result
	var sampling, other []connector.RequestID
	for _, it := range m.plan.Items {
		if it.Sample {
			sampling = append(sampling, it.ID)
			res = append(res, Result{ID: it.ID, Token: 1})
		} else {
			other = append(other, it.ID)
		}
	}
	kind := rapid.IntRange(0, 4).Draw(t, "badKind")
	var want error
	var name string
	switch {
	case kind == 0:
		name = "nobody"
		res = append(res, Result{ID: "nobody"})
		want = ErrUnknownRequest
	case kind == 1 && len(sampling) > 0:
		name = string(sampling[0])
		res = append(res, Result{ID: sampling[0]})
		want = ErrBadResult
	case kind == 2 && len(sampling) > 0:
		name = string(res[len(res)-1].ID)
		res = res[:len(res)-1]
		want = ErrBadResult
	case kind == 3 && len(other) > 0:
		name = string(other[0])
		res = append(res, Result{ID: other[0]})
		want = ErrBadResult
	default:
		name = "Outputs"
		if m.h.conn != nil {
			t.Skip("outputs are fine with a connector")
		}
		m.unchanged(t, ErrBadResult, "Outputs", func() error { return m.h.s.Done(res, []*connector.Output{{}}) })
		return
	}
	m.unchanged(t, want, name, func() error { return m.h.s.Done(res, nil) })
}

// drain ends every request: no more failures or pending lookups, every
// transfer finishes, every sampled token ends its request. It fails if
// held blocks are not released within a bound.
func (m *machine) drain(t *rapid.T) {
	m.t = t
	// First more steps with the connector still random, then calm.
	for range rapid.IntRange(0, 20).Draw(t, "randomDrain") {
		m.StepDone(t)
		m.check(t)
	}
	if c := m.h.conn; c != nil {
		c.pending, c.hit, c.done, c.failAt = nil, nil, nil, nil
	}
	if m.inFlight {
		m.Done(t)
	}
	// Every step computes at least one token while requests wait, and
	// each request computes its tokens at most twice (a preemption), so
	// this bounds a drain that makes progress.
	bound := 50
	for _, r := range m.h.s.reqs {
		bound += 2 * (len(r.tokens) + 1)
	}
	for i := 0; len(m.h.s.reqs) > 0; i++ {
		if i > bound {
			t.Fatalf("not drained after %d steps: %+v", i, m.h.s.Stats())
		}
		p, err := m.h.s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.h.compute(p); err != nil {
			t.Fatal(err)
		}
		var res []Result
		for _, it := range p.Items {
			if it.Sample {
				res = append(res, Result{ID: it.ID, Token: nextToken(m.h.reqs[it.ID].digests[it.End-1]), Finished: true})
			}
		}
		if err := m.h.s.Done(res, m.h.outs()); err != nil {
			t.Fatal(err)
		}
		m.h.apply(res)
		m.check(t)
	}
	st := m.h.s.Stats()
	if st.Pool.Used != 0 || st.Held != 0 {
		t.Fatalf("drained, but %d blocks used and %d requests held", st.Pool.Used, st.Held)
	}
	for id, mr := range m.h.reqs {
		if !mr.ended {
			t.Fatalf("request %q never ended", id)
		}
	}
	if m.h.conn != nil && len(m.h.conn.reqs) != 0 {
		t.Fatalf("the connector still knows %d requests", len(m.h.conn.reqs))
	}
}

func runMachine(t *rapid.T) { runMutant(t, mutNone) }

func runMutant(t *rapid.T, mut mutation) {
	m := newMachine(t, mut)
	t.Repeat(map[string]func(*rapid.T){
		"Add":        m.Add,
		"Add2":       m.Add,
		"Step":       m.Step,
		"Done":       m.Done,
		"StepDone":   m.StepDone, // whole steps are the common case
		"StepDone2":  m.StepDone,
		"StepDone3":  m.StepDone,
		"Abort":      m.Abort,
		"Invalidate": m.Invalidate,
		"BadDone":    m.BadDone,
		"":           m.check,
	})
	m.drain(t)
}

func TestStateMachine(t *testing.T) {
	rapid.Check(t, runMachine)
}

// TestStateMachineLong runs the state machine with at least 2000 checks
// (more with -rapid.checks).
func TestStateMachineLong(t *testing.T) {
	if testing.Short() {
		t.Skip("long property run; skipped with -short")
	}
	f := flag.Lookup("rapid.checks")
	if n, _ := strconv.Atoi(f.Value.String()); n < 2000 {
		old := f.Value.String()
		if err := f.Value.Set("2000"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := f.Value.Set(old); err != nil {
				t.Error(err)
			}
		})
	}
	rapid.Check(t, runMachine)
}
