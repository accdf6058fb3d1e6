package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// miniEngine is a CPU engine over real KV memory: tensor-parallel workers,
// each with its own KV blocks registered with a storeconn worker, and a
// "model" whose every KV value is a digest of the token prefix (different
// per rank, layer and K/V part). It samples each token from the KV it reads
// back from memory, so a block loaded with wrong bytes, or reused while a
// transfer touched it, changes the output, and is reported by name.
type miniEngine struct {
	loop
	conn connector.Planner // nil: no connector
	mems []*rdma.HostMemory
	kv   connector.KVCache
	bs   int
	// withhold, in stepLayers: the next step that loads hands Done none
	// of its Outputs, and the step after hands them late (a worker whose
	// Poll after the last layer does not report its loads); withheld
	// keeps them, unreported the error Done returned for it.
	withhold   bool
	withheld   []*connector.Output
	unreported error
}

const (
	e2eLayers = 2
	e2eKV     = 2
	e2eTP     = 2
)

func e2eIdentity(bs int) hashing.Identity {
	id := testIdentity(bs)
	id.Layout.TPSize = e2eTP
	id.Layout.KVHeads = 2
	id.Layout.Layers = e2eLayers
	return id
}

// e2eStore returns an empty memstore of 4 MiB, closed at the end of the
// test.
func e2eStore(t *testing.T) *memstore.Store {
	t.Helper()
	st, err := memstore.New(memstore.Config{Capacity: 4 << 20})
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("no host memory for the store on this platform: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return st
}

// newMiniEngine opens a scheduler with blocks blocks over st (nil: no
// connector) and, with a store, a storeconn scheduler half and one worker
// per rank.
func newMiniEngine(t *testing.T, st store.Store, cfg Config) *miniEngine {
	t.Helper()
	return newMiniEngineLookup(t, st, cfg, "sync")
}

// newMiniEngineLookup is newMiniEngine with the connector's lookups run
// as lookup says: "sync" inside Match, "async" on the connector's pool.
func newMiniEngineLookup(t *testing.T, st store.Store, cfg Config, lookup string) *miniEngine {
	t.Helper()
	return newMiniEngineWith(t, st, cfg, map[string]any{"lookup": lookup})
}

// newMiniEngineWith is newMiniEngine with the connector's
// kv_connector_extra_config.
func newMiniEngineWith(t *testing.T, st store.Store, cfg Config, extra map[string]any) *miniEngine {
	t.Helper()
	return newMiniEngineConn(t, st, cfg, connector.Config{Connector: storeconn.Name, Extra: extra})
}

// newMiniEngineConn is newMiniEngine with the connector's config ccfg.
func newMiniEngineConn(t *testing.T, st store.Store, cfg Config, ccfg connector.Config) *miniEngine {
	t.Helper()
	bs := cfg.Identity.Layout.BlockSize
	e := &miniEngine{loop: loop{t: t, prompts: map[connector.RequestID]*modelReq{}}, bs: bs}
	e.kv = connector.KVCache{Layers: e2eLayers, Blocks: cfg.Blocks, KV: e2eKV, BlockBytes: 8 * bs, Order: connector.BlockMajor}
	for range e2eTP {
		m, err := rdma.AllocHost(e2eLayers * e2eKV * cfg.Blocks * 8 * bs)
		if errors.Is(err, rdma.ErrUnsupported) {
			t.Skipf("no host memory for KV blocks on this platform: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		})
		e.mems = append(e.mems, m)
	}
	if st != nil {
		env := connector.Env{Identity: cfg.Identity, Store: st}
		sc, err := connector.OpenPlanner(ccfg, env)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := sc.Close(); err != nil {
				t.Error(err)
			}
		})
		e.conn = sc
		for rank := range e2eTP {
			env.Rank = rank
			w, err := connector.OpenWorker(ccfg, env)
			if err != nil {
				t.Fatal(err)
			}
			kv := e.kv
			kv.Regions = []rdma.Region{e.mems[rank].Region()}
			if err := w.Register(kv); err != nil {
				t.Fatal(err)
			}
			// Registered last, so it closes first: before the memory
			// it reads is freed.
			t.Cleanup(func() {
				if err := w.Close(); err != nil {
					t.Error(err)
				}
			})
			e.workers = append(e.workers, w)
		}
	}
	s, err := New(cfg, e.conn)
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	return e
}

// slot returns the 8 bytes of position p (in block b) of rank, layer l and
// part k.
func (e *miniEngine) slot(rank int, b BlockID, l, k, p int) []byte {
	off := ((int(b)*e2eLayers+l)*e2eKV+k)*8*e.bs + (p%e.bs)*8
	return e.mems[rank].Bytes()[off : off+8]
}

func kvValue(d uint64, rank, l, k int) uint64 {
	return d ^ uint64(rank+1)<<60 ^ uint64(l+1)<<56 ^ uint64(k+1)<<52
}

func (e *miniEngine) add(id string, prompt []hashing.Token, maxGen int) {
	e.t.Helper()
	m := &modelReq{id: connector.RequestID(id), tokens: slices.Clone(prompt), maxGen: maxGen}
	if err := e.s.Add(Request{ID: m.id, Prompt: prompt, MaxTokens: maxGen}); err != nil {
		e.t.Fatal(err)
	}
	e.prompts[m.id] = m
}

// step runs one engine step: workers start the connector's loads, the
// model computes the plan, workers save and report.
func (e *miniEngine) step() (*Plan, error) {
	p, err := e.s.Step()
	if err != nil {
		return nil, err
	}
	return p, e.stepPlan(p, true)
}

// stepPlan runs the plan p of the step in flight: it computes p after
// the workers start its loads (when start is set, else the caller started
// them), and ends the step.
func (e *miniEngine) stepPlan(p *Plan, start bool) error {
	res, err := e.compute(p, start)
	if err != nil {
		return err
	}
	return e.endStep(context.Background(), res)
}

// compute computes the plan p of the step in flight after the workers
// start its loads (when start is set, else the caller started them), and
// returns the step's results.
func (e *miniEngine) compute(p *Plan, start bool) ([]Result, error) {
	ctx := context.Background()
	for _, w := range e.workers {
		if !start {
			break
		}
		if err := w.Start(ctx, p.Metadata); err != nil {
			return nil, err
		}
	}
	var res []Result
	for _, it := range p.Items {
		m := e.prompts[it.ID]
		m.digests = prefixDigests(m.digests, "", m.tokens)
		var sum uint64
		for rank := range e2eTP {
			for pos := 0; pos < it.End; pos++ {
				b := it.Blocks[pos/e.bs]
				for l := range e2eLayers {
					for k := range e2eKV {
						s := e.slot(rank, b, l, k, pos)
						want := kvValue(m.digests[pos], rank, l, k)
						if pos >= it.Start {
							binary.LittleEndian.PutUint64(s, want)
						} else if got := binary.LittleEndian.Uint64(s); got != want {
							return nil, fmt.Errorf("step %d: request %q attends to wrong KV: rank %d position %d (block %d, layer %d, part %d) holds %#x, want %#x",
								p.Step, it.ID, rank, pos, b, l, k, got, want)
						}
						sum = sum*31 + binary.LittleEndian.Uint64(s)
					}
				}
			}
		}
		if it.Sample {
			m.gen++
			res = append(res, Result{ID: it.ID, Token: hashing.Token(sum>>11) % 50, Finished: m.gen >= m.maxGen})
		}
	}
	return res, nil
}

// run steps until every request ended and every block came back.
func (e *miniEngine) run() map[connector.RequestID][]hashing.Token { return e.drain(e.step, 64) }

// loop is what the test engines share: the scheduler, its workers, the
// requests' prompts and outputs, and the end of every step.
type loop struct {
	t       *testing.T
	s       *Scheduler
	workers []connector.Worker
	prompts map[connector.RequestID]*modelReq
	outs    []*connector.Output
}

// endStep saves the step's blocks in every worker, hands their Outputs and
// the step's results to the scheduler, and records the sampled tokens.
func (e *loop) endStep(ctx context.Context, res []Result) error {
	e.outs = e.outs[:0]
	for _, w := range e.workers {
		if err := w.Save(ctx, connector.Ready); err != nil {
			return err
		}
		e.outs = append(e.outs, w.Poll())
	}
	if err := e.s.Done(res, e.outs); err != nil {
		return err
	}
	for _, r := range res {
		e.prompts[r.ID].tokens = append(e.prompts[r.ID].tokens, r.Token)
	}
	return nil
}

// drain steps until every request ended and every block came back,
// checking the invariants every `every` steps: the connector's transfers
// run on its goroutines, so idle steps yield to them.
func (e *loop) drain(step func() (*Plan, error), every int) map[connector.RequestID][]hashing.Token {
	e.t.Helper()
	for i := 0; len(e.s.reqs) > 0; i++ {
		p, err := step()
		if err != nil {
			e.t.Fatal(err)
		}
		if len(p.Items) == 0 {
			runtime.Gosched()
		}
		if i%every == 0 {
			if err := checkInvariants(e.s, nil, nil); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	if st := e.s.Stats(); st.Pool.Used != 0 || st.Held != 0 {
		e.t.Fatalf("drained with %d blocks used, %d requests held", st.Pool.Used, st.Held)
	}
	out := map[connector.RequestID][]hashing.Token{}
	for id, m := range e.prompts {
		out[id] = slices.Clone(m.tokens)
	}
	return out
}

// workload adds requests sharing prefixes, as a multi-turn chat would.
func workload(e *miniEngine, tag string) {
	for i := range 12 {
		base := seq(1000*(i%3), 20+4*(i%4))
		e.add(fmt.Sprintf("%s%d", tag, i), append(base, seq(7*i, i%5)...), 3+i%4)
	}
}

// reference returns the outputs of the workload on an engine of cfg with
// no connector and no prefix cache.
func reference(t *testing.T, cfg Config, more ...func(*miniEngine)) map[connector.RequestID][]hashing.Token {
	t.Helper()
	cfg.PrefixCaching = false
	ref := newMiniEngine(t, nil, cfg)
	workload(ref, "q")
	for _, add := range more {
		add(ref)
	}
	return ref.run()
}

func TestStoreconnEndToEnd(t *testing.T) {
	st := e2eStore(t)
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}

	want := reference(t, cfg)

	// Engine A computes and saves.
	a := newMiniEngine(t, st, cfg)
	workload(a, "q")
	if diff := diffOutputs(want, a.run()); diff != "" {
		t.Fatalf("engine A outputs differ from the reference:\n%s", diff)
	}
	if a.s.Stats().ExternalTokens != 0 {
		t.Fatalf("engine A loaded %d tokens from an empty store", a.s.Stats().ExternalTokens)
	}

	// Engine B, a cold start on the same store, loads instead of computing.
	b := newMiniEngine(t, st, cfg)
	workload(b, "q")
	if diff := diffOutputs(want, b.run()); diff != "" {
		t.Fatalf("engine B outputs differ from the reference:\n%s", diff)
	}
	sa, sb := a.s.Stats(), b.s.Stats()
	if sb.ExternalTokens == 0 || sb.ComputedTokens >= sa.ComputedTokens {
		t.Fatalf("engine B: %d external tokens, computed %d (A computed %d)", sb.ExternalTokens, sb.ComputedTokens, sa.ComputedTokens)
	}
	t.Logf("A: computed %d, local %d; B: computed %d, local %d, external %d",
		sa.ComputedTokens, sa.LocalTokens, sb.ComputedTokens, sb.LocalTokens, sb.ExternalTokens)

	// After a weight update nothing of generation 0 is reused, locally or
	// from the store.
	if err := b.s.Invalidate(1); err != nil {
		t.Fatal(err)
	}
	before := b.s.Stats()
	b.add("rot", seq(0, 20), 2)
	if _, err := b.step(); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.s.Status("rot"); st.Metrics.LocalTokens != 0 || st.Metrics.ExternalTokens != 0 || st.State != Running {
		t.Fatalf("after rotation: %+v", st)
	}
	b.run()
	if got := b.s.Stats().ExternalTokens; got != before.ExternalTokens {
		t.Fatalf("after rotation %d tokens came from the store", got-before.ExternalTokens)
	}
}

// TestStoreconnPreemption runs the workload in a pool too small for it, so
// that requests are preempted while their saves run and come back once
// released.
func TestStoreconnPreemption(t *testing.T) {
	st := e2eStore(t)
	cfg := Config{Identity: e2eIdentity(4), Blocks: 14, MaxBatchedTokens: 64, PrefixCaching: true}
	refCfg := cfg
	refCfg.Blocks = 200
	ref := newMiniEngine(t, nil, refCfg)
	workload(ref, "q")
	want := ref.run()

	e := newMiniEngine(t, st, cfg)
	workload(e, "q")
	if diff := diffOutputs(want, e.run()); diff != "" {
		t.Fatalf("outputs differ from the reference:\n%s", diff)
	}
	if st := e.s.Stats(); st.Preemptions == 0 {
		t.Fatalf("no preemption in a pool of %d blocks: %+v", cfg.Blocks, st)
	}
	t.Logf("%+v", e.s.Stats())
}

func diffOutputs(want, got map[connector.RequestID][]hashing.Token) string {
	out := ""
	for id, w := range want {
		if g := got[id]; !slices.Equal(w, g) {
			out += fmt.Sprintf("%s: got %v, want %v\n", id, g, w)
		}
	}
	if len(got) != len(want) {
		out += fmt.Sprintf("%d requests, want %d\n", len(got), len(want))
	}
	return out
}

// stepLayers runs one step as a layer-wise engine does
// (Config.LayerwiseLoads): every worker starts the step's loads, and the
// model computes layer by layer, each after WaitLayer in every worker and
// saved with SaveLayer once computed; it samples from the KV once every
// layer is in. A request whose loaded KV it finds wrong must be one whose
// work Done discards (its load failed): any other is an error naming it.
func (e *miniEngine) stepLayers() (*Plan, error) {
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
	wrong := map[connector.RequestID]error{}
	// A request that attended wrong KV in a layer computes wrong KV in
	// every later one, as a model's hidden states carry the error on.
	tainted := map[connector.RequestID]bool{}
	for l := range e2eLayers {
		for _, w := range e.workers {
			if err := w.(connector.LayerWorker).WaitLayer(ctx, l); err != nil {
				return nil, err
			}
		}
		for _, it := range p.Items {
			m := e.prompts[it.ID]
			m.digests = prefixDigests(m.digests, "", m.tokens)
			for rank := range e2eTP {
				for pos := 0; pos < it.End; pos++ {
					for k := range e2eKV {
						s := e.slot(rank, it.Blocks[pos/e.bs], l, k, pos)
						want := kvValue(m.digests[pos], rank, l, k)
						if pos >= it.Start {
							if tainted[it.ID] {
								want = ^want
							}
							binary.LittleEndian.PutUint64(s, want)
						} else if got := binary.LittleEndian.Uint64(s); got != want && wrong[it.ID] == nil {
							wrong[it.ID] = fmt.Errorf("step %d: request %q attends to wrong KV and its result counted: rank %d position %d (layer %d, part %d) holds %#x, want %#x",
								p.Step, it.ID, rank, pos, l, k, got, want)
						}
					}
				}
			}
		}
		for id := range wrong {
			tainted[id] = true
		}
		for _, w := range e.workers {
			if err := w.(connector.LayerWorker).SaveLayer(ctx, l, connector.Ready); err != nil {
				return nil, err
			}
		}
	}
	var res []Result
	for _, it := range p.Items {
		if !it.Sample {
			continue
		}
		m := e.prompts[it.ID]
		var sum uint64
		for rank := range e2eTP {
			for pos := 0; pos < it.End; pos++ {
				for l := range e2eLayers {
					for k := range e2eKV {
						sum = sum*31 + binary.LittleEndian.Uint64(e.slot(rank, it.Blocks[pos/e.bs], l, k, pos))
					}
				}
			}
		}
		m.gen++
		res = append(res, Result{ID: it.ID, Token: hashing.Token(sum>>11) % 50, Finished: m.gen >= m.maxGen})
	}
	e.outs = e.outs[:0]
	for _, w := range e.workers {
		if err := w.Save(ctx, connector.Ready); err != nil {
			return nil, err
		}
		e.outs = append(e.outs, w.Poll())
	}
	outs, withheld := e.outs, false
	switch {
	case e.withhold && len(p.Metadata.Loads) > 0:
		for _, o := range e.outs {
			e.withheld = append(e.withheld, &connector.Output{Rank: o.Rank, Done: slices.Clone(o.Done), Failed: slices.Clone(o.Failed)})
		}
		outs, withheld, e.withhold = nil, true, false
	case e.withheld != nil:
		outs, e.withheld = append(e.withheld, e.outs...), nil
	}
	if err := e.s.Done(res, outs); err != nil {
		if !withheld || !errors.Is(err, ErrConnector) {
			return nil, err
		}
		e.unreported = err // the step is done: Done carried on
	}
	discarded := e.s.Discarded()
	for _, r := range res {
		if slices.Contains(discarded, r.ID) {
			e.prompts[r.ID].gen--
			continue
		}
		e.prompts[r.ID].tokens = append(e.prompts[r.ID].tokens, r.Token)
	}
	for id, err := range wrong {
		if !slices.Contains(discarded, id) {
			return nil, err
		}
	}
	if n := e.s.Stats().Loading; n > 0 && !withheld {
		return nil, fmt.Errorf("step %d: %d requests wait for a load, which a layer-wise engine runs in its step", p.Step, n)
	}
	return p, nil
}

// TestLayerwiseLoadsEndToEnd: a cold-start engine B that loads layer by
// layer (Config.LayerwiseLoads over storeconn with a value per layer) runs
// each request in the step of its load and gives the reference's outputs,
// also over a store that fails a third of its gets: the requests whose
// load failed have their step discarded (the engine checks that a request
// that attended wrong KV is one of those) and recompute. B's requests go
// on past what engine A saved, so B saves blocks of its own: a third
// engine C, over the store without faults, loads them and checks every
// byte it attends to, which catches a block B computed over KV that did
// not load and saved.
func TestLayerwiseLoadsEndToEnd(t *testing.T) {
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
	refCfg := cfg
	refCfg.PrefixCaching = false
	ref := newMiniEngine(t, nil, refCfg)
	workload(ref, "q")
	want := ref.run()
	refLong := newMiniEngine(t, nil, refCfg)
	longWorkload(refLong, "q")
	wantLong := refLong.run()
	refFirst := newMiniEngine(t, nil, refCfg)
	firstToken(refFirst, "q")
	wantFirst := refFirst.run()

	extra := map[string]any{"lookup": "sync", "layer_chunks": e2eLayers, "failed_ttl": "1ns"}
	lw := cfg
	lw.LayerwiseLoads = true
	for _, faults := range []bool{false, true} {
		t.Run(fmt.Sprintf("faults=%v", faults), func(t *testing.T) {
			st := e2eStore(t)
			a := newMiniEngineWith(t, st, lw, extra)
			workload(a, "q")
			if diff := diffOutputs(want, a.drain(a.stepLayers, 64)); diff != "" {
				t.Fatalf("engine A outputs differ from the reference:\n%s", diff)
			}
			var bst store.Store = st
			if faults {
				bst = storetest.NewFaulty(st, storetest.FaultOptions{Ops: storetest.OpGet, KeyRate: 0.3, Seed: 7})
			}
			b := newMiniEngineWith(t, bst, lw, extra)
			longWorkload(b, "q")
			if diff := diffOutputs(wantLong, b.drain(b.stepLayers, 64)); diff != "" {
				t.Fatalf("engine B outputs differ from the reference:\n%s", diff)
			}
			c := newMiniEngineWith(t, st, lw, extra)
			longWorkload(c, "q")
			if diff := diffOutputs(wantLong, c.drain(c.stepLayers, 64)); diff != "" {
				t.Fatalf("engine C outputs differ from the reference:\n%s", diff)
			}
			if sc := c.s.Stats(); sc.LoadFailures != 0 || sc.ExternalTokens <= b.s.Stats().ExternalTokens {
				t.Fatalf("engine C: %+v, want more tokens loaded than B loaded of A's, with no failure", sc)
			}
			sb := b.s.Stats()
			if sb.ExternalTokens == 0 || sb.InlineLoads == 0 {
				t.Fatalf("engine B loaded nothing in the step of its requests: %+v", sb)
			}
			if faults && (sb.LoadFailures == 0 || sb.DiscardedSteps == 0) {
				t.Fatalf("no load failed, or no step was discarded, over a store failing 30%% of its gets: %+v", sb)
			}
			t.Logf("B: external %d tokens, computed %d, load failures %d", sb.ExternalTokens, sb.ComputedTokens, sb.LoadFailures)

			// Requests that end with their first token, as a prefill
			// instance's do, in the step of their load.
			d := newMiniEngineWith(t, bst, lw, extra)
			firstToken(d, "q")
			if diff := diffOutputs(wantFirst, d.drain(d.stepLayers, 64)); diff != "" {
				t.Fatalf("engine D (one token per request) outputs differ from the reference:\n%s", diff)
			}
			if sd := d.s.Stats(); sd.InlineLoads == 0 {
				t.Fatalf("engine D ran no load in the step of its request: %+v", sd)
			}
		})
	}
}

// longWorkload is workload with 12 more tokens per prompt.
func longWorkload(e *miniEngine, tag string) {
	for i := range 12 {
		base := seq(1000*(i%3), 20+4*(i%4))
		p := append(append(base, seq(7*i, i%5)...), seq(500+i, 12)...)
		e.add(fmt.Sprintf("%s%d", tag, i), p, 3+i%4)
	}
}

// TestLayerwiseUnreportedLoad: when the Outputs of the step of a
// layer-wise load do not report it (a worker breaking the rule that the
// Poll after the last layer reports every load), Done returns an error
// wrapping ErrConnector, discards the step's work of the requests, which
// wait for their loads as whole loads do, and the outputs stay the
// reference's once the reports come.
func TestLayerwiseUnreportedLoad(t *testing.T) {
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
	refCfg := cfg
	refCfg.PrefixCaching = false
	ref := newMiniEngine(t, nil, refCfg)
	workload(ref, "q")
	want := ref.run()

	extra := map[string]any{"lookup": "sync", "layer_chunks": e2eLayers}
	lw := cfg
	lw.LayerwiseLoads = true
	st := e2eStore(t)
	a := newMiniEngineWith(t, st, lw, extra)
	workload(a, "q")
	a.drain(a.stepLayers, 64)
	b := newMiniEngineWith(t, st, lw, extra)
	b.withhold = true
	workload(b, "q")
	if diff := diffOutputs(want, b.drain(b.stepLayers, 64)); diff != "" {
		t.Fatalf("outputs differ from the reference:\n%s", diff)
	}
	if b.unreported == nil || !strings.Contains(b.unreported.Error(), "report no end of the layer-wise load") {
		t.Fatalf("Done of the step whose loads went unreported returned %v, want an error saying so", b.unreported)
	}
	if b.s.Stats().ExternalTokens == 0 {
		t.Fatalf("engine B loaded nothing: %+v", b.s.Stats())
	}
}

// firstToken is workload with one generated token per request.
func firstToken(e *miniEngine, tag string) {
	for i := range 12 {
		base := seq(1000*(i%3), 20+4*(i%4))
		e.add(fmt.Sprintf("%s%d", tag, i), append(base, seq(7*i, i%5)...), 1)
	}
}

// failedEvent is the readiness of a step whose compute was abandoned.
type failedEvent struct{}

func (failedEvent) Query() (bool, error) { return false, errors.New("the step was abandoned") }

// TestWorkersLost loses rank 1 of two workers with a step in flight: its
// memory is scribbled over and a new worker takes its place, the survivor
// abandons the step, and the ledger reports what rank 1 never will. Every
// request must still produce the reference's tokens, and every block must
// come back: a cache kept across the loss reads the scribbled KV, and a
// transfer left unreported holds its blocks forever.
func TestWorkersLost(t *testing.T) {
	for _, policy := range []connector.Policy{connector.PolicyRecompute, connector.PolicyFail} {
		t.Run(string(policy), func(t *testing.T) {
			st := e2eStore(t)
			cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
			// late comes once blocks are committed; its prefix is in the
			// store only, so the step after it loads.
			late := append(seq(5000, 24), seq(77, 3)...)
			want := reference(t, cfg, func(e *miniEngine) { e.add("late", late, 3) })

			// A first engine fills the store, so that the second one's
			// requests load prefixes both before and after the loss.
			fill := newMiniEngine(t, st, cfg)
			for i := range 3 {
				fill.add(fmt.Sprintf("fill%d", i), seq(1000*i, 20), 1)
			}
			fill.add("fill-late", seq(5000, 24), 1)
			fill.run()

			ccfg := connector.Config{Connector: storeconn.Name, LoadFailurePolicy: policy, Extra: map[string]any{"lookup": "sync"}}
			e := newMiniEngineConn(t, st, cfg, ccfg)
			workload(e, "q")
			ledger := connector.NewLedger(e2eTP)
			ctx := context.Background()
			// Lose the rank once some blocks are committed to the
			// local prefix cache, with a step in flight that loads:
			// rank 1 never reports those loads.
			deadline := time.Now().Add(2 * time.Minute)
			var lostBefore, loads int
			var loadIDs []uint64 // of the step in flight
			for {
				p, err := e.s.Step()
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range e.workers {
					if err := w.Start(ctx, p.Metadata); err != nil {
						t.Fatal(err)
					}
				}
				if err := ledger.Shipped(p.Metadata); err != nil {
					t.Fatal(err)
				}
				st := e.s.Stats()
				lostBefore, loads = ledger.Outstanding(1), len(p.Metadata.Loads)
				if st.Pool.Committed > 0 && loads > 0 {
					for _, x := range p.Metadata.Loads {
						loadIDs = append(loadIDs, x.ID)
					}
					break
				}

				if time.Now().After(deadline) {
					t.Fatalf("waited 2m for committed blocks and a step that loads: %+v", st)
				}
				if err := e.stepPlan(p, false); err != nil {
					t.Fatal(err)
				}
				if len(p.Items) == 0 {
					runtime.Gosched()
				}
				for _, o := range e.outs {
					if err := ledger.Reported(o); err != nil {
						t.Fatal(err)
					}
				}
				if st.Pool.Committed > 0 && e.prompts["late"] == nil {
					e.add("late", late, 3)
				}
			}

			// The survivor abandons the step (its saves fail) and ends
			// its loads: so the loads rank 1 never reports end, failed,
			// in WorkersLost itself, while their requests still load.
			if err := e.workers[0].Save(ctx, failedEvent{}); err != nil {
				t.Fatal(err)
			}
			var survived []*connector.Output
			for waitFor := loadIDs; len(waitFor) > 0; {
				if time.Now().After(deadline) {
					t.Fatalf("waited 2m for rank 0 to end %d loads", len(waitFor))
				}
				o := e.workers[0].Poll()
				if len(o.Done) == 0 {
					runtime.Gosched()
					continue
				}
				if err := ledger.Reported(o); err != nil {
					t.Fatal(err)
				}
				survived = append(survived, &connector.Output{Rank: o.Rank, Done: slices.Clone(o.Done), Failed: slices.Clone(o.Failed)})
				waitFor = slices.DeleteFunc(waitFor, func(id uint64) bool { return slices.Contains(o.Done, id) })
			}

			// Rank 1 dies: its worker goes, its memory is lost.
			if err := e.workers[1].Close(); err != nil {
				t.Fatal(err)
			}
			for i := range e.mems[1].Bytes() {
				e.mems[1].Bytes()[i] = 0xab
			}
			w, err := connector.OpenWorker(ccfg, connector.Env{Identity: cfg.Identity, Store: st, Rank: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := w.Close(); err != nil {
					t.Error(err)
				}
			})
			kv := e.kv
			kv.Regions = []rdma.Region{e.mems[1].Region()}
			if err := w.Register(kv); err != nil {
				t.Fatal(err)
			}
			e.workers[1] = w

			lost, err := ledger.Lost(1, connector.ReasonCanceled)
			if err != nil {
				t.Fatal(err)
			}
			if len(lost.Done) != lostBefore {
				t.Fatalf("the lost rank's Output reports %d transfers, the ledger had %d open", len(lost.Done), lostBefore)
			}
			if err := e.s.WorkersLost(append(survived, lost)); err != nil {
				t.Fatal(err)
			}
			if err := e.s.Done(nil, nil); !errors.Is(err, ErrNoStep) {
				t.Fatalf("Done after WorkersLost ended the step: %v, want ErrNoStep", err)
			}
			if err := checkInvariants(e.s, nil, nil); err != nil {
				t.Fatal(err)
			}
			if st := e.s.Stats(); st.Running != 0 || st.Loading != 0 {
				t.Fatalf("after WorkersLost: %d running, %d loading; want every request preempted", st.Running, st.Loading)
			}

			deadline = time.Now().Add(2 * time.Minute)
			for len(e.s.reqs) > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("waited 2m for %d requests to end after the loss: %+v", len(e.s.reqs), e.s.Stats())
				}
				p, err := e.step()
				if err != nil {
					t.Fatal(err)
				}
				if len(p.Items) == 0 {
					runtime.Gosched()
				}
			}
			if st := e.s.Stats(); st.Pool.Used != 0 || st.Held != 0 {
				t.Fatalf("drained with %d blocks used, %d requests held", st.Pool.Used, st.Held)
			}
			ended := map[connector.RequestID]State{}
			for _, en := range e.s.TakeEnded(nil) {
				ended[en.ID] = en.State
			}
			var failed int
			for id, m := range e.prompts {
				if ended[id] == Failed {
					failed++
					continue
				}
				if diff := cmp.Diff(want[id], m.tokens); diff != "" {
					t.Errorf("request %q after the loss (-reference +got):\n%s", id, diff)
				}
			}
			ss := e.s.Stats()
			// The loads rank 1 had in flight count failed: the ledger
			// reported them so.
			if ss.LoadFailures == 0 {
				t.Errorf("no load failed; the step lost with rank 1 loaded %d transfers", loads)
			}
			switch {
			case policy == connector.PolicyRecompute && failed != 0:
				t.Errorf("%d requests failed under the recompute policy", failed)
			case policy == connector.PolicyFail && failed == 0:
				t.Errorf("no request failed under the fail policy, with %d loads lost", loads)
			}
			t.Logf("preemptions %d, failed %d, load failures %d, external tokens %d", ss.Preemptions, failed, ss.LoadFailures, ss.ExternalTokens)
		})
	}
}
