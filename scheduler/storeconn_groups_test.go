package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// hybridEngine is miniEngine for the hybrid layout of hybridIdentity:
// per rank, a full-attention layer's and a sliding-window layer's paged
// K and V and a state layer's states, registered with storeconn workers
// as KVCache.Groups. Every value is a digest of the token prefix it
// stands for; each sampled token depends on every value the last position
// of its step sees.
type hybridEngine struct {
	loop
	mems   [][]*rdma.HostMemory // per rank, per group
	kv     connector.KVCache
	bs     int
	window int
}

func newHybridEngine(t *testing.T, st store.Store, cfg Config) *hybridEngine {
	t.Helper()
	l := cfg.Identity.Layout
	e := &hybridEngine{loop: loop{t: t, prompts: map[connector.RequestID]*modelReq{}}, bs: l.BlockSize, window: l.Groups[1].Window}
	for g, spec := range l.Groups {
		gk := connector.KVCache{Layers: 1, Blocks: cfg.poolSize(g), KV: 2, BlockBytes: 8 * e.bs, Order: connector.BlockMajor}
		if spec.Kind == hashing.RecurrentState {
			gk.KV, gk.BlockBytes = 1, spec.StateBytes
		}
		e.kv.Groups = append(e.kv.Groups, gk)
	}
	for range l.TPSize {
		var mems []*rdma.HostMemory
		for g := range e.kv.Groups {
			m, err := rdma.AllocHost(e.kv.Groups[g].Blocks * e.kv.Groups[g].BlockSize())
			if errors.Is(err, rdma.ErrUnsupported) {
				t.Skipf("no host memory for KV blocks on this platform: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Free() })
			mems = append(mems, m)
		}
		e.mems = append(e.mems, mems)
	}
	var conn connector.Planner
	if st != nil {
		ccfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
		env := connector.Env{Identity: cfg.Identity, Store: st}
		sc, err := connector.OpenPlanner(ccfg, env)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sc.Close() })
		conn = sc
		for rank := range l.TPSize {
			env.Rank = rank
			w, err := connector.OpenWorker(ccfg, env)
			if err != nil {
				t.Fatal(err)
			}
			kv := e.kv
			kv.Groups = slices.Clone(kv.Groups)
			for g := range kv.Groups {
				kv.Groups[g].Regions = []rdma.Region{e.mems[rank][g].Region()}
			}
			if err := w.Register(kv); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
			e.workers = append(e.workers, w)
		}
	}
	s, err := New(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	return e
}

// value returns the 8 bytes of position p (a state for group 2) in block
// b of group g, part k, of rank.
func (e *hybridEngine) value(rank, g int, b BlockID, k, p int) []byte {
	off := int(b) * e.kv.Groups[g].BlockSize()
	if g != 2 {
		off += k*8*e.bs + (p%e.bs)*8
	}
	return e.mems[rank][g].Bytes()[off : off+8]
}

func (e *hybridEngine) add(id string, prompt []hashing.Token, maxGen int) {
	e.t.Helper()
	m := &modelReq{id: connector.RequestID(id), tokens: slices.Clone(prompt), maxGen: maxGen}
	if err := e.s.Add(Request{ID: m.id, Prompt: prompt, MaxTokens: maxGen}); err != nil {
		e.t.Fatal(err)
	}
	e.prompts[m.id] = m
}

func (e *hybridEngine) step() (*Plan, error) {
	ctx := context.Background()
	p, err := e.s.Step()
	if err != nil {
		return nil, err
	}
	for _, w := range e.workers {
		if err := w.Start(ctx, p.Metadata); err != nil {
			return nil, err
		}
	}
	var res []Result
	for _, it := range p.Items {
		m := e.prompts[it.ID]
		m.digests = prefixDigests(m.digests, "", m.tokens)
		var sum uint64
		rw := func(rank, g int, b BlockID, k, pos int, read bool) error {
			s := e.value(rank, g, b, k, pos)
			want := kvValue(m.digests[pos], rank, g, k)
			if !read {
				binary.LittleEndian.PutUint64(s, want)
			} else if got := binary.LittleEndian.Uint64(s); got != want {
				return fmt.Errorf("step %d: request %q reads wrong KV: rank %d group %d position %d (block %d, part %d) holds %#x, want %#x",
					p.Step, it.ID, rank, g, pos, b, k, got, want)
			}
			return nil
		}
		for rank := range e.mems {
			for pos := 0; pos < it.End; pos++ {
				for g := range 2 {
					if g == 1 && pos < it.Start-e.window+1 {
						continue
					}
					for k := range 2 {
						if err := rw(rank, g, it.Tables[g][pos/e.bs], k, pos, pos < it.Start); err != nil {
							return nil, err
						}
					}
				}
			}
			st, t := it.State, it.Tables[2]
			if it.Start > 0 {
				if err := rw(rank, 2, t[st.In], 0, it.Start-1, true); err != nil {
					return nil, err
				}
			}
			if st.Snapshot >= 0 {
				rw(rank, 2, t[st.Snapshot], 0, (st.Snapshot+1)*e.bs-1, false)
			}
			rw(rank, 2, t[st.Out], 0, it.End-1, false)
			// What the last position sees: every K and V of full
			// attention, the window's, the state after it.
			for pos := 0; pos < it.End; pos++ {
				for g := range 2 {
					if g == 1 && pos < it.End-e.window {
						continue
					}
					for k := range 2 {
						sum = sum*31 + binary.LittleEndian.Uint64(e.value(rank, g, it.Tables[g][pos/e.bs], k, pos))
					}
				}
			}
			sum = sum*31 + binary.LittleEndian.Uint64(e.value(rank, 2, t[st.Out], 0, it.End-1))
		}
		if it.Sample {
			m.gen++
			res = append(res, Result{ID: it.ID, Token: hashing.Token(sum>>11) % 50, Finished: m.gen >= m.maxGen})
		}
	}
	if err := e.endStep(ctx, res); err != nil {
		return nil, err
	}
	return p, nil
}

func (e *hybridEngine) run() map[connector.RequestID][]hashing.Token { return e.drain(e.step, 16) }

// TestStoreconnGroups runs a hybrid workload through storeconn: an engine
// that computes and saves, then a cold one on the same store and one in a
// pool small enough to preempt, each generating what an engine without a
// connector or prefix cache does.
func TestStoreconnGroups(t *testing.T) {
	st, err := memstore.New(memstore.Config{Capacity: 8 << 20})
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("no host memory for the store on this platform: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	id := hybridIdentity(4, 6)
	id.Layout.TPSize = e2eTP
	cfg := Config{Identity: id, GroupBlocks: []int{96, 48, 64}, MaxBatchedTokens: 16, PrefixCaching: true}
	work := func(e *hybridEngine) {
		for i := range 12 {
			base := seq(1000*(i%3), 20+4*(i%4))
			e.add(fmt.Sprintf("q%d", i), append(base, seq(7*i, i%5)...), 3+i%4)
		}
	}
	refCfg := cfg
	refCfg.PrefixCaching = false
	ref := newHybridEngine(t, nil, refCfg)
	work(ref)
	want := ref.run()

	a := newHybridEngine(t, st, cfg)
	work(a)
	if diff := diffOutputs(want, a.run()); diff != "" {
		t.Fatalf("engine A outputs differ from the reference:\n%s", diff)
	}
	b := newHybridEngine(t, st, cfg)
	work(b)
	if diff := diffOutputs(want, b.run()); diff != "" {
		t.Fatalf("engine B (cold, warm store) outputs differ from the reference:\n%s", diff)
	}
	sa, sb := a.s.Stats(), b.s.Stats()
	if sb.ExternalTokens == 0 || sb.ComputedTokens >= sa.ComputedTokens {
		t.Fatalf("engine B: %d external tokens, computed %d (A computed %d)", sb.ExternalTokens, sb.ComputedTokens, sa.ComputedTokens)
	}
	small := cfg
	small.GroupBlocks = []int{14, small.leastBlocks(id.Layout.Groups[1]), 6}
	c := newHybridEngine(t, st, small)
	work(c)
	if diff := diffOutputs(want, c.run()); diff != "" {
		t.Fatalf("engine C (small pools) outputs differ from the reference:\n%s", diff)
	}
	t.Logf("A: computed %d, local %d; B: computed %d, local %d, external %d; C: %+v",
		sa.ComputedTokens, sa.LocalTokens, sb.ComputedTokens, sb.LocalTokens, sb.ExternalTokens, c.s.Stats())
}
