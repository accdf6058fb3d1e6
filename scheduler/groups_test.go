package scheduler

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// The hybrid layout of these tests: blocks of 4 tokens; group 0 full
// attention, group 1 a sliding window of 6 tokens, group 2 a state.
const (
	gbs     = 4
	gwindow = 6
)

const no = connector.NoBlock

func hybridConfig() Config {
	return Config{Identity: hybridIdentity(gbs, gwindow), GroupBlocks: []int{32, 32, 32}, MaxBatchedTokens: 16, PrefixCaching: true}
}

// present returns the indices of t's entries that hold a block.
func present(t []BlockID) []int {
	var out []int
	for i, b := range t {
		if b != no {
			out = append(out, i)
		}
	}
	return out
}

// wantEntries checks which entries of request id's table of group g hold
// a block.
func (h *harness) wantEntries(id connector.RequestID, g int, want ...int) {
	h.t.Helper()
	if diff := cmp.Diff(want, present(h.s.reqs[id].tabs[g])); diff != "" {
		h.t.Fatalf("request %q, group %d: entries with a block (-want +got):\n%s", id, g, diff)
	}
}

func (h *harness) settledStep() *Plan {
	h.t.Helper()
	p := h.stepDone()
	if err := h.settled(); err != nil {
		h.t.Fatalf("after step %d: %v", p.Step, err)
	}
	return p
}

// TestGroupsLifecycle follows one hybrid request: prefill chunks end at
// block boundaries, the state is kept at each chunk's end and at the last
// boundary before the prompt's end, sliding-window blocks leave the table
// once out of the window, and a later request hits locally only where
// every group can resume.
func TestGroupsLifecycle(t *testing.T) {
	h := newHarness(t, hybridConfig(), noConn)
	a := seq(1, 30)
	h.mustAdd("a", a, 4)

	// [0, 16): one aligned chunk; its state goes to entry 3.
	p := h.settledStep()
	if it := p.Items[0]; it.Start != 0 || it.End != 16 || it.State != (StateEntries{In: -1, Snapshot: -1, Out: 3}) {
		t.Fatalf("step 1: %+v", it)
	}
	h.wantEntries("a", 0, 0, 1, 2, 3)
	// The next position, 16, attends to tokens 11..16: blocks 2 on.
	h.wantEntries("a", 1, 2, 3)
	h.wantEntries("a", 2, 3)
	if st := h.s.PoolStats(1); st.Used != 2 || st.Cached != 2 {
		t.Errorf("window pool after step 1: %+v, want 2 used and the 2 blocks out of the window cached", st)
	}

	// [16, 30) reaches the prompt's end: the state after 28 tokens (the
	// last boundary inside) goes to entry 6, the one after 30 to entry 7.
	p = h.settledStep()
	if it := p.Items[0]; it.Start != 16 || it.End != 30 || it.State != (StateEntries{In: 3, Snapshot: 6, Out: 7}) {
		t.Fatalf("step 2: %+v", it)
	}
	h.wantEntries("a", 1, 6, 7)
	h.wantEntries("a", 2, 3, 6, 7)

	// Decodes update the running state in place; at 32 it is kept.
	for _, want := range []StateEntries{{In: 7, Snapshot: -1, Out: 7}, {In: 7, Snapshot: -1, Out: 7}, {In: 7, Snapshot: -1, Out: 8}} {
		p = h.settledStep()
		if got := p.Items[0].State; got != want {
			t.Fatalf("step %d: decode [%d, %d) State = %+v, want %+v", p.Step, p.Items[0].Start, p.Items[0].End, got, want)
		}
	}
	h.run(10)

	// A prompt sharing 28 tokens resumes at 28: the window (blocks 5, 6)
	// and the state after block 6 are cached.
	h.mustAdd("b", append(slices.Clone(a[:28]), 900, 901), 2)
	p = h.settledStep()
	if st, _ := h.s.Status("b"); st.Metrics.LocalTokens != 28 || p.Items[0].Start != 28 {
		t.Fatalf("b: %d local tokens, item %+v; want 28", st.Metrics.LocalTokens, p.Items[0])
	}
	h.run(10)
	// One sharing 20 tokens resumes at 16, the last boundary with a kept
	// state, though full attention has 5 blocks.
	h.mustAdd("c", append(slices.Clone(a[:20]), 900, 901, 902, 903), 1)
	p = h.settledStep()
	if it := p.Items[0]; it.Start != 16 || it.State.In != 3 {
		t.Fatalf("c computes %+v, want from 16 with the state of entry 3", it)
	}
	h.run(10)
}

// TestGroupsHiddenWindow: with a connector, a sliding-window block that
// falls out of the window within the step that computes it is never shown
// to the connector and is freed at once; one the connector was shown (and
// may be saving) leaves the table but is held until the release.
func TestGroupsHiddenWindow(t *testing.T) {
	h := newHarness(t, hybridConfig(), withConn)
	h.conn.done = func(*fakeXfer) bool { return false } // saves never finish
	h.mustAdd("a", seq(1, 30), 1)
	saves := func(p *Plan) map[int][]int {
		out := map[int][]int{}
		for _, x := range p.Metadata.Saves {
			for i := range x.Blocks {
				out[x.Group] = append(out[x.Group], x.First+i)
			}
		}
		return out
	}
	p := h.settledStep()
	// [0, 16): blocks 0 and 1 of the window are out of it by 16.
	if diff := cmp.Diff(map[int][]int{0: {0, 1, 2, 3}, 1: {2, 3}, 2: {3}}, saves(p)); diff != "" {
		t.Errorf("step 1 saves, per group (-want +got):\n%s", diff)
	}
	if st := h.s.PoolStats(1); st.Used != 2 {
		t.Errorf("window pool after step 1: %d used, want 2 (the hidden blocks freed)", st.Used)
	}
	p = h.settledStep()
	// [16, 30) reaches the last token: the window before 28, where the
	// same prompt resumes (blocks 5, 6), is shown; 4 is hidden and
	// freed; 2, 3 and 5, shown, leave the table but are held.
	if diff := cmp.Diff(map[int][]int{0: {4, 5, 6}, 1: {5, 6}, 2: {6}}, saves(p)); diff != "" {
		t.Errorf("step 2 saves, per group (-want +got):\n%s", diff)
	}
	h.wantEntries("a", 1, 6, 7)
	if r := h.s.reqs["a"]; len(r.gs[1].retired) != 3 || h.s.PoolStats(1).Used != 5 {
		t.Errorf("window group: %d retired blocks, %d used; want 3 held out of the table, 5 used", len(r.gs[1].retired), h.s.PoolStats(1).Used)
	}
	h.conn.done = nil
	h.run(10)
	if st := h.s.Stats().Pool; st.Used != 0 {
		t.Errorf("after the release: %d blocks used", st.Used)
	}
}

// TestGroupsWindowFreedOnceSaved: a sliding-window block the connector
// was shown leaves the table once out of the window and goes back to the
// pool as soon as every worker reported the transfers naming it Done, in
// the next step that schedules its request: a long decode holds a bounded
// number of window blocks. Without Outputs the scheduler cannot tell, and
// holds them until the connector releases the request.
func TestGroupsWindowFreedOnceSaved(t *testing.T) {
	decode := func(t *testing.T, outs bool) (most int) {
		h := newHarness(t, hybridConfig(), withConn)
		h.mustAdd("a", seq(1, 8), 40) // window blocks of 48 tokens: 12
		for range 200 {
			if len(h.s.reqs) == 0 {
				return most
			}
			p := h.step()
			var o []*connector.Output
			if outs {
				o = h.outs()
			}
			if err := h.s.Done(h.results(p), o); err != nil {
				t.Fatalf("Done: %v", err)
			}
			h.apply(h.results(p))
			if err := h.check(); err != nil {
				t.Fatalf("after step %d: %v", p.Step, err)
			}
			if r := h.s.reqs["a"]; r != nil {
				most = max(most, r.gs[1].refs)
			}
		}
		t.Fatalf("request a did not end in 200 steps")
		return 0
	}
	// Window gwindow tokens of gbs-token blocks: the window's blocks, the
	// one being filled, and one whose save is still reported next step.
	bound := (gwindow+gbs-1)/gbs + 2
	with, without := decode(t, true), decode(t, false)
	t.Logf("window blocks held at most: %d with Outputs, %d without", with, without)
	if with > bound {
		t.Errorf("with Outputs, request a held up to %d window blocks, want <= %d", with, bound)
	}
	if without <= bound {
		t.Errorf("without Outputs, request a held at most %d window blocks; want more than %d (held until its release): the test shows no difference", without, bound)
	}
}

// TestGroupsLoad: an external hit loads every full-attention block, the
// window before the match point and the state at it, and the request runs
// from there.
func TestGroupsLoad(t *testing.T) {
	h := newHarness(t, hybridConfig(), withConn)
	a := seq(1, 34)
	h.conn.warm(0, "", a[:32])
	h.mustAdd("a", a, 1)
	p := h.step()
	loads := map[int][]int{}
	for _, x := range p.Metadata.Loads {
		for i := range x.Blocks {
			loads[x.Group] = append(loads[x.Group], x.First+i)
		}
	}
	// The match ends at 32 (8 blocks; never the last token): the window
	// before 32 is tokens 27..31, blocks 6 and 7.
	if diff := cmp.Diff(map[int][]int{0: {0, 1, 2, 3, 4, 5, 6, 7}, 1: {6, 7}, 2: {7}}, loads); diff != "" {
		t.Fatalf("loads, per group (-want +got):\n%s", diff)
	}
	h.wantEntries("a", 1, 6, 7)
	h.wantEntries("a", 2, 7)
	h.done(p, h.results(p))
	p = h.settledStep()
	if it := p.Items[0]; it.Start != 32 || it.State.In != 7 {
		t.Fatalf("after the load: %+v, want [32, 34) from the state of entry 7", it)
	}
	h.run(10)
}

// TestGroupsFailedLoad: a failed load of a hybrid request leaves its local
// hit only; the state entries of the load go.
func TestGroupsFailedLoad(t *testing.T) {
	h := newHarness(t, hybridConfig(), withConn)
	a := seq(1, 34)
	h.mustAdd("a", a[:18], 1)
	h.run(20)
	h.conn.warm(0, "", a[:32])
	h.mustAdd("b", a, 1)
	h.conn.failAt = func(x *fakeXfer) int {
		if x.group == 0 {
			return 2
		}
		return -1
	}
	p := h.step() // local hit 16 (the state at 16 is kept), load to 32
	if st, _ := h.s.Status("b"); st.State != Loading || st.Metrics.LocalTokens != 16 {
		t.Fatalf("b: %+v, want loading after a local hit of 16 tokens", st)
	}
	h.done(p, h.results(p))
	if err := h.check(); err != nil {
		t.Fatal(err)
	}
	st := h.wantState("b", Running)
	if st.Computed != 16 {
		t.Fatalf("b rolled back to %d tokens, want its local 16", st.Computed)
	}
	h.wantEntries("b", 2, 3)
	h.conn.failAt = nil
	p = h.settledStep()
	if it := p.Items[0]; it.Start != 16 || it.State.In != 3 {
		t.Fatalf("b recomputes %+v, want from 16 with the state of entry 3", it)
	}
	h.run(20)
}

// TestGroupsKindsOnly: layouts of some of the kinds, without full
// attention too, run to the end.
func TestGroupsKindsOnly(t *testing.T) {
	for _, kinds := range [][]hashing.GroupKind{
		{hashing.SlidingWindow, hashing.RecurrentState},
		{hashing.FullAttention, hashing.SlidingWindow},
		{hashing.RecurrentState, hashing.FullAttention},
	} {
		cfg := Config{Identity: hybridIdentity(gbs, gwindow, kinds...), Blocks: 32, MaxBatchedTokens: 16, PrefixCaching: true}
		h := newHarness(t, cfg, withConn)
		h.mustAdd("a", seq(1, 40), 5)
		h.run(30)
		h.mustAdd("b", seq(1, 40), 5)
		p := h.settledStep()
		if p.Items[0].Start == 0 {
			t.Errorf("%v: a repeated prompt hits nothing", kinds)
		}
		h.run(30)
	}
}
