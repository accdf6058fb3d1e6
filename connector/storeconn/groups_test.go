package storeconn_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// The hybrid layout of these tests: layer 0 full attention, layer 1 a
// sliding window of 2 blocks, layer 2 a recurrent state of stateBytes.
const (
	window     = 2 * bs
	stateBytes = 48
)

func hybridIdentity() hashing.Identity {
	id := identity(1, 1)
	id.Layout.Layers = 3
	id.Layout.Groups = []hashing.Group{
		{Kind: hashing.FullAttention, Layers: []int{0}, BlockSize: bs},
		{Kind: hashing.SlidingWindow, Layers: []int{1}, BlockSize: bs, Window: window},
		{Kind: hashing.RecurrentState, Layers: []int{2}, BlockSize: bs, StateBytes: stateBytes},
	}
	return id
}

// hybridKV is one worker's memory for hybridIdentity: per group, nblocks
// blocks of 2×64 bytes (attention) or one state.
func hybridKV(t *testing.T, nblocks int) (connector.KVCache, []*rdma.HostMemory) {
	t.Helper()
	kv := connector.KVCache{Groups: []connector.KVCache{
		{Layers: 1, Blocks: nblocks, KV: 2, BlockBytes: 64, Order: connector.BlockMajor},
		{Layers: 1, Blocks: nblocks, KV: 2, BlockBytes: 64, Order: connector.BlockMajor},
		{Layers: 1, Blocks: nblocks, KV: 1, BlockBytes: stateBytes, Order: connector.BlockMajor},
	}}
	var mems []*rdma.HostMemory
	for g := range kv.Groups {
		m, err := rdma.AllocHost(nblocks * kv.Groups[g].BlockSize())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Free() })
		kv.Groups[g].Regions = []rdma.Region{m.Region()}
		mems = append(mems, m)
	}
	return kv, mems
}

type hybridRig struct {
	*rig
	gmem []*rdma.HostMemory // per group
	gkv  connector.KVCache
}

func newHybridRig(t *testing.T, extra map[string]any) *hybridRig {
	t.Helper()
	return newHybridRigOn(t, newMem(t), extra)
}

// newHybridRigOn is newHybridRig over st.
func newHybridRigOn(t *testing.T, st store.Store, extra map[string]any) *hybridRig {
	t.Helper()
	if extra == nil {
		extra = map[string]any{}
	}
	extra["lookup"] = "sync"
	cfg := connector.Config{Connector: storeconn.Name, Extra: extra}
	env := connector.Env{Identity: hybridIdentity(), Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	kv, mems := hybridKV(t, 32)
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("worker Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("scheduler Close: %v", err)
		}
	})
	return &hybridRig{rig: &rig{t: t, st: st, s: s, ws: []connector.Worker{w}, nblocks: 32}, gmem: mems, gkv: kv}
}

// block returns the bytes of block b of group g.
func (h *hybridRig) block(g int, b connector.BlockID) []byte {
	n := h.gkv.Groups[g].BlockSize()
	return h.gmem[g].Bytes()[int(b)*n : (int(b)+1)*n]
}

// fill gives every block of every group bytes that name the group, the
// block and seed.
func (h *hybridRig) fill(seed byte) {
	for g, m := range h.gmem {
		b := m.Bytes()
		for i := range b {
			b[i] = byte(i*13) ^ byte(g*71) ^ seed
		}
	}
}

func (h *hybridRig) zero() {
	for _, m := range h.gmem {
		clear(m.Bytes())
	}
}

// table returns blocks [0, n) with NoBlock where keep says no.
func table(n int, keep func(i int) bool) []connector.BlockID {
	t := blocks(n)
	for i := range t {
		if !keep(i) {
			t[i] = connector.NoBlock
		}
	}
	return t
}

func all(int) bool { return true }

// save computes req's prompt with the tables given and waits until its
// saves are released.
func (h *hybridRig) save(req *connector.Request, tables ...[]connector.BlockID) {
	h.t.Helper()
	if err := h.s.Scheduled(req, req.Prompt, tables...); err != nil {
		h.t.Fatalf("Scheduled: %v", err)
	}
	h.step(connector.Ready)
	keep, err := h.s.Finish(req, tables...)
	if err != nil {
		h.t.Fatalf("Finish: %v", err)
	}
	if keep {
		h.until("release of "+string(req.ID), func(p *connector.Progress) bool { return slices.Contains(p.Released, req.ID) })
	}
}

// load matches req, allocates with tables and runs the load to its end,
// returning the Metadata's loads and whether it loaded.
func (h *hybridRig) load(req *connector.Request, wantTokens int, tables ...[]connector.BlockID) ([]connector.Transfer, bool, []connector.LoadFailure) {
	h.t.Helper()
	m, err := h.s.Match(req, 0)
	if err != nil || m.Tokens != wantTokens {
		h.t.Fatalf("Match = %+v, %v; want %d tokens", m, err, wantTokens)
	}
	if err := h.s.Allocated(req, m.Tokens, tables...); err != nil {
		h.t.Fatalf("Allocated: %v", err)
	}
	meta := h.s.Plan()
	loads := make([]connector.Transfer, len(meta.Loads))
	for i, t := range meta.Loads {
		loads[i] = t
		loads[i].Blocks = slices.Clone(t.Blocks)
		loads[i].Hashes = nil
	}
	if err := h.ws[0].Start(context.Background(), meta); err != nil {
		h.t.Fatal(err)
	}
	var loaded bool
	var fails []connector.LoadFailure
	p := h.poll()
	for d := newDeadline(h.t, "the end of the load of "+string(req.ID)); ; d.tick() {
		loaded = slices.Contains(p.Loaded, req.ID)
		fails = append(fails, p.Failed...)
		if loaded || len(fails) > 0 {
			break
		}
		p = h.step(connector.Ready)
	}
	return loads, loaded, fails
}

// TestGroupsLoadWhatResumingNeeds: a hybrid request resumes from the
// store with every full-attention block, only the sliding-window blocks
// inside the window before the match point, and only the state at it;
// the other entries of its tables are neither read nor written.
func TestGroupsLoadWhatResumingNeeds(t *testing.T) {
	h := newHybridRig(t, nil)
	h.fill(1)
	want := make([][][]byte, 3)
	for g := range want {
		for b := range 8 {
			want[g] = append(want[g], slices.Clone(h.block(g, connector.BlockID(b))))
		}
	}
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), blocks(9), blocks(9))
	h.zero()

	// The match point is block 8 (the prompt's last token is never
	// matched). The window before token 32 is tokens 25..31: blocks 6, 7.
	b := request("b", 8*bs+1)
	swa := table(9, func(i int) bool { return i >= 6 })
	state := table(9, func(i int) bool { return i == 7 })
	loads, loaded, fails := h.load(b, 8*bs, blocks(9), swa, state)
	if !loaded || len(fails) > 0 {
		t.Fatalf("load: loaded %v, failures %+v", loaded, fails)
	}
	got := map[int][]connector.BlockID{}
	for _, l := range loads {
		got[l.Group] = append(got[l.Group], l.Blocks...)
		if l.Group == 1 && l.First != 6 || l.Group == 2 && l.First != 7 {
			t.Errorf("load of group %d starts at block %d", l.Group, l.First)
		}
	}
	wantLoads := map[int][]connector.BlockID{0: blocks(8), 1: {6, 7}, 2: {7}}
	for g, w := range wantLoads {
		if !slices.Equal(got[g], w) {
			t.Errorf("group %d loads blocks %v, want %v", g, got[g], w)
		}
	}
	for g := range 3 {
		for blk := range 8 {
			inside := g == 0 || g == 1 && blk >= 6 || g == 2 && blk == 7
			gotb := h.block(g, connector.BlockID(blk))
			switch {
			case inside && !slices.Equal(gotb, want[g][blk]):
				t.Errorf("group %d block %d: not the saved bytes after the load", g, blk)
			case !inside && slices.ContainsFunc(gotb, func(c byte) bool { return c != 0 }):
				t.Errorf("group %d block %d: written, but resuming at block 8 does not need it", g, blk)
			}
		}
	}
}

// TestGroupsMatchEndsWhereStateWasKept: an engine that kept the state only
// at the ends of its prefill chunks (blocks 3 and 5) can be resumed only
// there: the match ends at the latest, block 6 (after block 5).
func TestGroupsMatchEndsWhereStateWasKept(t *testing.T) {
	h := newHybridRig(t, nil)
	h.fill(2)
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), blocks(9), table(9, func(i int) bool { return i == 3 || i == 5 }))
	b := request("b", 8*bs+1)
	loads, loaded, fails := h.load(b, 6*bs, blocks(9), blocks(9), table(9, func(i int) bool { return i == 5 }))
	if !loaded || len(fails) > 0 {
		t.Fatalf("load: loaded %v, failures %+v", loaded, fails)
	}
	for _, l := range loads {
		if l.Group == 2 && !slices.Equal(l.Blocks, []connector.BlockID{5}) {
			t.Errorf("state group loads %v, want the state after block 5 only", l.Blocks)
		}
	}
}

// TestGroupsOldWindowNotRequired: the saving engine freed the
// sliding-window blocks that fell out of the window (NoBlock); they are
// not saved, and a match does not need them.
func TestGroupsOldWindowNotRequired(t *testing.T) {
	h := newHybridRig(t, nil)
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), table(9, func(i int) bool { return i >= 6 }), blocks(9))
	wst := h.ws[0].(connector.StatsReporter).Stats()
	if want := int64(8 + 2 + 8); wst.Saves != want {
		t.Errorf("worker saved %d blocks, want %d: 8 full-attention blocks, the 2 full window blocks kept (6, 7) and 8 states", wst.Saves, want)
	}
	b := request("b", 8*bs+1)
	_, loaded, fails := h.load(b, 8*bs, blocks(9), table(9, func(i int) bool { return i >= 6 }), table(9, func(i int) bool { return i == 7 }))
	if !loaded || len(fails) > 0 {
		t.Fatalf("load: loaded %v, failures %+v", loaded, fails)
	}
}

// TestGroupsFailedLoadKeepsLocalOnly: a failed load of a hybrid request
// leaves only its local blocks valid: a window or a state is no use
// without the rest.
func TestGroupsFailedLoadKeepsLocalOnly(t *testing.T) {
	h := newHybridRig(t, nil)
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), blocks(9), blocks(9))
	ns, err := hybridIdentity().Namespace()
	if err != nil {
		t.Fatal(err)
	}
	// The full-attention block 6 vanishes after the lookup found it.
	b := request("b", 8*bs+1)
	m, err := h.s.Match(b, bs)
	if err != nil || m.Tokens != 7*bs {
		t.Fatalf("Match = %+v, %v", m, err)
	}
	if err := h.st.Remove(context.Background(), ns.GroupKey(0, 0, b.Hashes[6])); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Allocated(b, m.Tokens, blocks(9), table(9, func(i int) bool { return i >= 6 }), table(9, func(i int) bool { return i == 7 })); err != nil {
		t.Fatal(err)
	}
	var fails []connector.LoadFailure
	h.until("the load's failure", func(p *connector.Progress) bool {
		if len(p.Loaded) > 0 {
			t.Fatalf("loaded %v, with a block missing", p.Loaded)
		}
		fails = append(fails, p.Failed...)
		return len(fails) > 0
	})
	if len(fails) != 1 || fails[0].Valid != bs {
		t.Errorf("failures %+v, want one with Valid = %d, the local block only", fails, bs)
	}
	// The match covered blocks 1 to 7, and all of them are discarded, not
	// only the failed transfer's blocks from block 6 on.
	if got := h.s.(connector.StatsReporter).Stats().LoadFailures; got != 7 {
		t.Errorf("Stats().LoadFailures = %d, want 7: every matched block from the valid point (block 1) to the match's end (block 8)", got)
	}
}

// TestGroupsRetryOnlyHeldBlocks: an out-of-space save of a sliding-window
// block is not retried once the engine freed the block (NoBlock in its
// later tables) or holds another there: by the retry the block may hold
// another request's KV.
func TestGroupsRetryOnlyHeldBlocks(t *testing.T) {
	full := storetest.NewFaulty(newMem(t), storetest.FaultOptions{Ops: storetest.OpPut, KeyRate: 1, PutErrors: []error{store.ErrNoSpace}})
	h := newHybridRigOn(t, full, map[string]any{"save_retries": 2, "retry_steps": 2})
	a := request("a", 8*bs+1)
	if err := h.s.Scheduled(a, 4*bs, blocks(9), blocks(9), blocks(9)); err != nil {
		t.Fatal(err)
	}
	h.step(connector.Ready) // every put finds no space: retried 2 steps on
	// The window moved on: the engine freed sliding-window blocks 0 and 1
	// (the window of the token at 20 starts at token 13, in block 3), and
	// holds block 20 in entry 2.
	swa := table(9, func(i int) bool { return i >= 3 })
	swa[2] = 20
	if err := h.s.Scheduled(a, 5*bs, blocks(9), swa, blocks(9)); err != nil {
		t.Fatal(err)
	}
	// Every save fails in the end: 5 blocks of 3 groups, each once
	// retried twice or dropped.
	retried := map[connector.BlockID]bool{}
	stats := h.s.(connector.StatsReporter)
	for d := newDeadline(t, "every save failing in the end"); stats.Stats().SaveFailures < 5*3; d.tick() {
		m := h.s.Plan()
		for _, tr := range m.Saves {
			for k, b := range tr.Blocks {
				if tr.Group != 1 || tr.First+k >= 4 {
					continue
				}
				retried[b] = true
				if want := swa[tr.First+k]; b != want {
					t.Errorf("step %d saves engine block %d as block %d of the sliding window, whose entry holds %d now (-1: NoBlock)", m.Step, b, tr.First+k, want)
				}
			}
		}
		for _, w := range h.ws {
			if err := w.Start(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			if err := w.Save(context.Background(), connector.Ready); err != nil {
				t.Fatal(err)
			}
		}
		h.poll()
	}
	if !retried[3] {
		t.Errorf("sliding-window block 3, still held, was never retried")
	}
}

// TestGroupsBadInput: tables that do not fit the layout are refused,
// naming the group and the entry.
func TestGroupsBadInput(t *testing.T) {
	h := newHybridRig(t, nil)
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), blocks(9), blocks(9))
	b := request("b", 8*bs+1)
	if _, err := h.s.Match(b, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		call func() error
		want string
	}{
		{"a group missing", func() error { return h.s.Allocated(b, 8*bs, blocks(9), blocks(9)) }, "2 block tables, want 3"},
		{"NoBlock in full attention", func() error {
			return h.s.Allocated(b, 8*bs, table(9, func(i int) bool { return i != 2 }), blocks(9), blocks(9))
		}, "blocks[0][2] (group 0, full) = -1"},
		{"NoBlock inside the window", func() error {
			return h.s.Allocated(b, 8*bs, blocks(9), table(9, func(i int) bool { return i != 7 }), blocks(9))
		}, "blocks[1][7] (group 1, sliding_window) = NoBlock, but the call transfers it"},
		{"no block for the state", func() error {
			return h.s.Allocated(b, 8*bs, blocks(9), blocks(9), table(9, func(i int) bool { return i != 7 }))
		}, "blocks[2][7] (group 2, state) = NoBlock"},
		{"a block twice in one group", func() error {
			dup := blocks(9)
			dup[7] = 6
			return h.s.Allocated(b, 8*bs, blocks(9), dup, blocks(9))
		}, "block 6 is named twice in the table of group 1"},
		{"a short table", func() error { return h.s.Allocated(b, 8*bs, blocks(9), blocks(9), blocks(5)) }, "5 blocks in the table of group 2 do not cover 32 tokens"},
	} {
		err := tt.call()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if m := h.s.Plan(); len(m.Loads)+len(m.Saves) != 0 {
		t.Errorf("the refused calls planned %d loads and %d saves", len(m.Loads), len(m.Saves))
	}
}

// TestGroupsRegister: memory that does not fit the identity's groups is
// refused, naming the field.
func TestGroupsRegister(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*connector.KVCache)
		want string
	}{
		{"no groups", func(kv *connector.KVCache) { *kv = kv.Groups[0] }, "KVCache has no Groups, but the identity's layout has 3 KV cache groups"},
		{"a group missing", func(kv *connector.KVCache) { kv.Groups = kv.Groups[:2] }, "KVCache.Groups has 2 groups, but the identity's layout has 3"},
		{"a state of another size", func(kv *connector.KVCache) {
			kv.Groups[2].BlockBytes = stateBytes / 2
			kv.Groups[2].Blocks *= 2
		}, "KVCache.Groups[2] holds KV = 1 × BlockBytes = 24 bytes per layer and block, but Layout.Groups[2].StateBytes = 48"},
		{"layers", func(kv *connector.KVCache) {
			kv.Groups[1].Layers = 2
			kv.Groups[1].Blocks /= 2
		}, "KVCache.Groups[1].Layers = 2, but the identity's Layout.Groups[1] has 1 layers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := connector.Config{Connector: storeconn.Name}
			w, err := connector.OpenWorker(cfg, connector.Env{Identity: hybridIdentity(), Store: newMem(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			kv, _ := hybridKV(t, 8)
			tt.edit(&kv)
			err = w.Register(kv)
			if !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Register = %v, want ErrConfig containing %q", err, tt.want)
			}
		})
	}
}

// TestGroupsFailedLoadAfterRematch: a hybrid request matched again while
// its load runs (with more local blocks) still gets, when that load fails,
// only the local blocks it had when the load was planned.
func TestGroupsFailedLoadAfterRematch(t *testing.T) {
	h := newHybridRig(t, nil)
	a := request("a", 8*bs+1)
	h.save(a, blocks(9), blocks(9), blocks(9))
	ns, err := hybridIdentity().Namespace()
	if err != nil {
		t.Fatal(err)
	}
	b := request("b", 8*bs+1)
	m, err := h.s.Match(b, 0)
	if err != nil || m.Tokens != 8*bs {
		t.Fatalf("Match = %+v, %v", m, err)
	}
	if err := h.s.Allocated(b, m.Tokens, blocks(9), table(9, func(i int) bool { return i >= 6 }), table(9, func(i int) bool { return i == 7 })); err != nil {
		t.Fatal(err)
	}
	if err := h.st.Remove(context.Background(), ns.GroupKey(0, 0, b.Hashes[2])); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Match(b, 4*bs); err != nil {
		t.Fatal(err)
	}
	var fails []connector.LoadFailure
	h.until("the load's failure", func(p *connector.Progress) bool {
		if len(p.Loaded) > 0 {
			t.Fatalf("loaded %v, with a block missing", p.Loaded)
		}
		fails = append(fails, p.Failed...)
		return len(fails) > 0
	})
	if len(fails) != 1 || fails[0].Valid != 0 {
		t.Errorf("failures %+v, want one with Valid = 0: the load was planned with no local blocks", fails)
	}
}

// TestGroupBlocks: Env.GroupBlocks bounds each group's ids by its own pool.
func TestGroupBlocks(t *testing.T) {
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
	env := connector.Env{Identity: hybridIdentity(), Store: newMem(t), GroupBlocks: []int{32, 32, 8}}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := request("a", 8*bs+1)
	err = s.Scheduled(a, a.Prompt, blocks(9), blocks(9), blocks(9))
	if !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), "blocks[2][8] (group 2, state) = 8, want [0, 8)") {
		t.Errorf("Scheduled with state block 8 of 8 = %v, want ErrInvalidBlock naming it", err)
	}
	if err := s.Scheduled(a, a.Prompt, blocks(9), blocks(9), table(9, func(i int) bool { return i < 8 })); err != nil {
		t.Errorf("Scheduled within every pool = %v", err)
	}
	env.GroupBlocks = []int{32, 32}
	if _, err := connector.OpenPlanner(cfg, env); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), "Env.GroupBlocks has 2 entries, want one per KV cache group: 3") {
		t.Errorf("OpenPlanner with 2 pool sizes for 3 groups = %v, want ErrConfig naming it", err)
	}
}
