package storeconn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

const lwLayers = 4 // layers of the layer-wise tests' model

func lwIdentity() hashing.Identity {
	id := identity(1, 1)
	id.Layout.Layers = lwLayers
	return id
}

// lwRig is one engine instance over a shared store: a scheduler half and
// one layer-wise worker with host KV memory of 16 blocks of 4 layers × K/V
// × 64 bytes.
type lwRig struct {
	t    *testing.T
	s    connector.Planner
	w    connector.LayerWorker
	kv   connector.KVCache
	mem  *rdma.HostMemory
	late *connector.Output // lateStep's
}

func newLWRig(t *testing.T, st store.Store, order connector.Order, extra map[string]any) *lwRig {
	t.Helper()
	cfg := connector.Config{Connector: storeconn.Name, Extra: extra}
	env := connector.Env{Identity: lwIdentity(), Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	lw, ok := w.(connector.LayerWorker)
	if !ok {
		t.Fatalf("storeconn's Worker is not a connector.LayerWorker")
	}
	kv := connector.KVCache{Layers: lwLayers, Blocks: 16, KV: 2, BlockBytes: 64, Order: order}
	m, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		t.Fatal(err)
	}
	kv.Regions = []rdma.Region{m.Region()}
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	r := &lwRig{t: t, s: s, w: lw, kv: kv, mem: m}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("worker Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("scheduler Close: %v", err)
		}
		m.Free()
	})
	return r
}

// layer returns the bytes of layer l (K and V) of block b.
func (r *lwRig) layer(b connector.BlockID, l int) []byte {
	var out []byte
	for _, sp := range r.kv.LayerSpans(nil, b, l, l+1) {
		out = append(out, sp.Bytes()...)
	}
	return out
}

// fill writes a pattern of seed over layer l of blocks [0, n), as the
// forward pass computes it.
func (r *lwRig) fill(n, l int, seed byte) {
	for b := range n {
		for _, sp := range r.kv.LayerSpans(nil, connector.BlockID(b), l, l+1) {
			p := sp.Bytes()
			for i := range p {
				p[i] = seed ^ byte(b*31+l*7+i)
			}
		}
	}
}

// step runs one step layer by layer: WaitLayer, compute (fill), SaveLayer,
// then Save and Poll, and returns the worker's Output passed to Update.
func (r *lwRig) step(m *connector.Metadata, compute func(l int)) *connector.Progress {
	r.t.Helper()
	p, err := r.s.Update([]*connector.Output{r.run(m, compute)})
	if err != nil {
		r.t.Fatalf("Update: %v", err)
	}
	return p
}

// lateStep runs a step as step does, but keeps the worker's Output
// (copied) in r.late instead of passing it to Update.
func (r *lwRig) lateStep(m *connector.Metadata, compute func(l int)) {
	r.t.Helper()
	o := r.run(m, compute)
	r.late = &connector.Output{Rank: o.Rank, Done: slices.Clone(o.Done), Failed: slices.Clone(o.Failed)}
}

// run runs one step on the worker, layer by layer, and returns its Poll.
func (r *lwRig) run(m *connector.Metadata, compute func(l int)) *connector.Output {
	r.t.Helper()
	ctx := context.Background()
	if err := r.w.Start(ctx, m); err != nil {
		r.t.Fatalf("Start: %v", err)
	}
	for l := range lwLayers {
		if err := r.w.WaitLayer(ctx, l); err != nil {
			r.t.Fatalf("WaitLayer(%d): %v", l, err)
		}
		if compute != nil {
			compute(l)
		}
		if err := r.w.SaveLayer(ctx, l, connector.Ready); err != nil {
			r.t.Fatalf("SaveLayer(%d): %v", l, err)
		}
	}
	if err := r.w.Save(ctx, connector.Ready); err != nil {
		r.t.Fatalf("Save: %v", err)
	}
	return r.w.Poll()
}

// settle steps with nothing new until done reports true.
func (r *lwRig) settle(what string, done func(*connector.Progress) bool) {
	r.t.Helper()
	for d := newDeadline(r.t, what); ; d.tick() {
		if done(r.step(r.s.Plan(), nil)) {
			return
		}
	}
}

// prefill computes req's prompt in one step, saving layer by layer, and
// waits until the saves are in the store.
func (r *lwRig) prefill(req *connector.Request, seed byte) {
	r.t.Helper()
	n := len(req.Hashes)
	if err := r.s.Scheduled(req, req.Prompt, blocks(n+1)); err != nil {
		r.t.Fatalf("Scheduled: %v", err)
	}
	r.step(r.s.Plan(), func(l int) { r.fill(n, l, seed) })
	if keep, err := r.s.Finish(req, blocks(n+1)); err != nil {
		r.t.Fatalf("Finish: %v", err)
	} else if keep {
		r.settle("release of "+string(req.ID), func(p *connector.Progress) bool { return len(p.Released) > 0 })
	}
}

// match waits for r's lookup and returns its answer.
func (r *lwRig) match(req *connector.Request) int {
	r.t.Helper()
	for d := newDeadline(r.t, "the lookup of "+string(req.ID)); ; d.tick() {
		m, err := r.s.Match(req, 0)
		if err != nil {
			r.t.Fatalf("Match: %v", err)
		}
		if !m.Pending {
			return m.Tokens
		}
	}
}

// TestLayerwiseRoundTrip saves a prompt layer by layer on one instance
// and loads it layer by layer, in the step that computes the rest, on
// another: every layer of every loaded block arrives byte-exact, for each
// memory order, each verification setting and 1 to 4 values per block.
// With several values per block the store holds one per layer range and
// none under the block's plain key.
func TestLayerwiseRoundTrip(t *testing.T) {
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		for _, verify := range []string{"checksum", "none"} {
			for _, chunks := range []int{1, 2, 3, 4} {
				t.Run(fmt.Sprintf("%v/%s/chunks=%d", order, verify, chunks), func(t *testing.T) {
					st := newMem(t)
					extra := map[string]any{"verify": verify, "layer_chunks": chunks, "lookup": "sync"}
					a := newLWRig(t, st, order, extra)
					b := newLWRig(t, st, order, extra)
					req := request("r", 4*bs+1) // 4 full blocks
					a.prefill(req, 0x5a)

					plain := mustNS(t).Key(0, req.Hashes[0])
					res := make([]store.Result, 1)
					if err := st.Exists(context.Background(), []string{plain}, res); err != nil {
						t.Fatal(err)
					}
					if whole := res[0].Err == nil; whole != (chunks == 1) {
						t.Errorf("the block's plain key %s present = %v with layer_chunks = %d", plain, whole, chunks)
					}

					if got := b.match(req); got != 4*bs {
						t.Fatalf("Match = %d tokens, want %d", got, 4*bs)
					}
					if err := b.s.Allocated(req, 4*bs, blocks(5)); err != nil {
						t.Fatal(err)
					}
					m := b.s.Plan()
					if len(m.Loads) != 1 {
						t.Fatalf("Plan has %d loads, want 1", len(m.Loads))
					}
					var checked int
					p := b.step(m, func(l int) {
						// Layer l of every block is in before the
						// forward pass computes layer l.
						for blk := range 4 {
							id := connector.BlockID(blk)
							if got, want := b.layer(id, l), a.layer(id, l); !bytes.Equal(got, want) {
								t.Errorf("after WaitLayer(%d): block %d's layer %d differs from what was saved", l, blk, l)
							}
							checked++
						}
					})
					if checked != 4*lwLayers {
						t.Fatalf("checked %d layers of blocks, want %d", checked, 4*lwLayers)
					}
					if len(p.Loaded) != 1 || len(p.Failed) != 0 {
						t.Fatalf("Progress after the load step = %+v, want r loaded: the Poll after the last WaitLayer reports every load", p)
					}
				})
			}
		}
	}
}

func mustNS(t *testing.T) hashing.Namespace {
	t.Helper()
	ns, err := lwIdentity().Namespace()
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// gated holds every get of a key that contains hold until open is closed.
type gated struct {
	store.Store
	hold string
	open chan struct{}
}

func (g gated) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	for _, k := range keys {
		if strings.Contains(k, g.hold) {
			select {
			case <-g.open:
			case <-ctx.Done():
				return ctx.Err()
			}
			break
		}
	}
	return g.Store.Get(ctx, keys, dst, res)
}

// TestWaitLayerWaitsForItsChunkOnly holds the get of the second half of
// the layers: WaitLayer of the first two layers returns with their bytes
// in, WaitLayer of a later layer does not return until the get does.
func TestWaitLayerWaitsForItsChunkOnly(t *testing.T) {
	mem := newMem(t)
	extra := map[string]any{"layer_chunks": 2, "lookup": "sync", "store_timeout": "10m"}
	a := newLWRig(t, mem, connector.BlockMajor, extra)
	req := request("r", 2*bs+1)
	a.prefill(req, 0x33)

	g := gated{Store: mem, hold: "/l2-4", open: make(chan struct{})}
	b := newLWRig(t, g, connector.BlockMajor, extra)
	if got := b.match(req); got != 2*bs {
		t.Fatalf("Match = %d, want %d", got, 2*bs)
	}
	if err := b.s.Allocated(req, 2*bs, blocks(3)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.w.Start(ctx, b.s.Plan()); err != nil {
		t.Fatal(err)
	}
	for l := range 2 {
		if err := b.w.WaitLayer(ctx, l); err != nil {
			t.Fatalf("WaitLayer(%d) = %v", l, err)
		}
		for blk := range 2 {
			if !bytes.Equal(b.layer(connector.BlockID(blk), l), a.layer(connector.BlockID(blk), l)) {
				t.Errorf("after WaitLayer(%d): block %d's layer differs", l, blk)
			}
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := b.w.WaitLayer(short, 2)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitLayer(2) while its chunk's get is held = %v, want the context's deadline", err)
	}
	if out := b.w.Poll(); len(out.Done) != 0 {
		t.Fatalf("Poll while a chunk is held reports %v done", out.Done)
	}
	close(g.open)
	if err := b.w.WaitLayer(ctx, 3); err != nil {
		t.Fatalf("WaitLayer(3) = %v", err)
	}
	if out := b.w.Poll(); len(out.Done) != 1 || len(out.Failed) != 0 {
		t.Fatalf("Poll after WaitLayer of the last layer = %+v, want the load done", out)
	}
}

// notYet is a ready event that reports done once fire was called.
type notYet struct {
	mu   sync.Mutex
	done bool
}

func (e *notYet) Query() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.done, nil
}

func (e *notYet) fire() {
	e.mu.Lock()
	e.done = true
	e.mu.Unlock()
}

// TestSaveLayerSavesWhatIsComputed: a chunk is queued by the SaveLayer of
// its last layer and read only once that call's ready event fires; a
// later chunk whose event fired first is stored first.
func TestSaveLayerSavesWhatIsComputed(t *testing.T) {
	st := newMem(t)
	r := newLWRig(t, st, connector.BlockMajor, map[string]any{"layer_chunks": 2})
	req := request("r", bs+1)
	if err := r.s.Scheduled(req, req.Prompt, blocks(2)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.w.Start(ctx, r.s.Plan()); err != nil {
		t.Fatal(err)
	}
	ns := mustNS(t)
	key := func(lo, hi int) string {
		return ns.LayerKey(0, 0, req.Hashes[0], lo, hi)
	}
	has := func(k string) bool {
		res := make([]store.Result, 1)
		if err := st.Exists(ctx, []string{k}, res); err != nil {
			t.Fatal(err)
		}
		return res[0].Err == nil
	}
	first := &notYet{}
	for l := range lwLayers {
		r.fill(1, l, 9)
		ev := connector.Event(connector.Ready)
		if l == 1 {
			ev = first
		}
		if err := r.w.SaveLayer(ctx, l, ev); err != nil {
			t.Fatalf("SaveLayer(%d) = %v", l, err)
		}
	}
	for d := newDeadline(t, "the second chunk "+key(2, 4)+" in the store"); !has(key(2, 4)); d.tick() {
	}
	if has(key(0, 2)) {
		t.Fatalf("%s is in the store before its ready event fired", key(0, 2))
	}
	first.fire()
	for d := newDeadline(t, "the first chunk "+key(0, 2)+" in the store"); !has(key(0, 2)); d.tick() {
	}
	var out *connector.Output
	for d := newDeadline(t, "the save reported done"); ; d.tick() {
		if out = r.w.Poll(); len(out.Done) > 0 {
			break
		}
	}
	if len(out.Failed) != 0 {
		t.Fatalf("save reported failures %v", out.Failed)
	}
}

// TestLayerwiseMisuse: layers out of range, waited on or saved twice or
// out of order, or before any Start, are errors naming the layer.
func TestLayerwiseMisuse(t *testing.T) {
	r := newLWRig(t, newMem(t), connector.BlockMajor, map[string]any{"layer_chunks": 2})
	ctx := context.Background()
	want := func(err error, what, name string) {
		t.Helper()
		if !errors.Is(err, connector.ErrLayer) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s = %v, want an error wrapping connector.ErrLayer naming %s", what, err, name)
		}
	}
	want(r.w.WaitLayer(ctx, 0), "WaitLayer before Start", "WaitLayer(0)")
	if err := r.w.Start(ctx, r.s.Plan()); err != nil {
		t.Fatal(err)
	}
	want(r.w.WaitLayer(ctx, -1), "WaitLayer(-1)", "WaitLayer(-1)")
	want(r.w.WaitLayer(ctx, lwLayers), "WaitLayer(Layers)", fmt.Sprintf("WaitLayer(%d)", lwLayers))
	want(r.w.SaveLayer(ctx, lwLayers, connector.Ready), "SaveLayer(Layers)", fmt.Sprintf("SaveLayer(%d)", lwLayers))
	if err := r.w.WaitLayer(ctx, 2); err != nil {
		t.Fatalf("WaitLayer(2) = %v", err)
	}
	want(r.w.WaitLayer(ctx, 2), "WaitLayer(2) twice", "WaitLayer(2)")
	want(r.w.WaitLayer(ctx, 1), "WaitLayer(1) after WaitLayer(2)", "WaitLayer(1)")
	if err := r.w.SaveLayer(ctx, 1, connector.Ready); err != nil {
		t.Fatalf("SaveLayer(1) = %v", err)
	}
	want(r.w.SaveLayer(ctx, 0, connector.Ready), "SaveLayer(0) after SaveLayer(1)", "SaveLayer(0)")
	if err := r.w.SaveLayer(ctx, 2, nil); err == nil || !strings.Contains(err.Error(), "SaveLayer(2)") {
		t.Errorf("SaveLayer(2, nil) = %v, want an error naming the nil ready event", err)
	}
	// A new step starts the order again.
	if err := r.w.Start(ctx, r.s.Plan()); err != nil {
		t.Fatal(err)
	}
	if err := r.w.WaitLayer(ctx, 0); err != nil {
		t.Errorf("WaitLayer(0) in the next step = %v", err)
	}
	if err := r.w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.w.WaitLayer(ctx, 1); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("WaitLayer after Close = %v, want ErrClosed", err)
	}
	if err := r.w.SaveLayer(ctx, 1, connector.Ready); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("SaveLayer after Close = %v, want ErrClosed", err)
	}
}

// TestLoadStepSavesWaitForTheLoad: a request that computes in the step of
// its load has its new blocks saved only once every worker reported the
// load, in a later Metadata; when the load fails they are never saved,
// since they were computed over KV that did not arrive, nor when the
// step's Outputs do not report the load (late: it is reported a step
// later, after the step's compute read its blocks).
func TestLoadStepSavesWaitForTheLoad(t *testing.T) {
	for _, c := range []struct{ fails, late bool }{{false, false}, {true, false}, {false, true}} {
		fails, late := c.fails, c.late
		t.Run(fmt.Sprintf("fails=%v/late=%v", fails, late), func(t *testing.T) {
			mem := newMem(t)
			extra := map[string]any{"layer_chunks": 2, "lookup": "sync"}
			a := newLWRig(t, mem, connector.BlockMajor, extra)
			a.prefill(request("r", 2*bs+1), 1)

			b := newLWRig(t, mem, connector.BlockMajor, extra)
			req := request("r", 4*bs+1) // blocks 0 and 1 in the store, 2 and 3 to compute
			if got := b.match(req); got != 2*bs {
				t.Fatalf("Match = %d, want %d", got, 2*bs)
			}
			if err := b.s.Allocated(req, 2*bs, blocks(5)); err != nil {
				t.Fatal(err)
			}
			if err := b.s.Scheduled(req, 4*bs, blocks(5)); err != nil {
				t.Fatal(err)
			}
			if fails {
				// Block 1's second chunk is gone: the load fails at block 1.
				if err := mem.Remove(context.Background(), mustNS(t).LayerKey(0, 0, req.Hashes[1], 2, 4)); err != nil {
					t.Fatal(err)
				}
			}
			m := b.s.Plan()
			if len(m.Loads) != 1 || len(m.Saves) != 0 {
				t.Fatalf("the load step's Metadata has %d loads and %d saves, want 1 and 0: its saves wait for the load", len(m.Loads), len(m.Saves))
			}
			var p *connector.Progress
			if late {
				b.lateStep(m, func(l int) { b.fill(4, l, 2) })
				var err error
				if p, err = b.s.Update(nil); err != nil || len(p.Loaded)+len(p.Failed) != 0 {
					t.Fatalf("Update without the step's Outputs = %+v, %v, want nothing", p, err)
				}
				b.s.Plan()
				if p, err = b.s.Update([]*connector.Output{b.late}); err != nil {
					t.Fatal(err)
				}
			} else {
				p = b.step(m, func(l int) { b.fill(4, l, 2) })
			}
			if fails {
				if len(p.Failed) != 1 || p.Failed[0].Valid != bs {
					t.Fatalf("Progress = %+v, want r failed with 1 block valid", p)
				}
			} else if len(p.Loaded) != 1 {
				t.Fatalf("Progress = %+v, want r loaded", p)
			}
			next := b.s.Plan()
			var saved []int
			for _, tr := range next.Saves {
				for k := range tr.Blocks {
					saved = append(saved, tr.First+k)
				}
			}
			if fails && len(saved) != 0 {
				t.Fatalf("after a failed load the next Metadata saves blocks %v computed over it", saved)
			}
			if late && len(saved) != 0 {
				t.Fatalf("after a load reported a step late the next Metadata saves blocks %v computed before it ended", saved)
			}
			if !fails && !late && fmt.Sprint(saved) != "[2 3]" {
				t.Fatalf("after the load the next Metadata saves blocks %v, want [2 3]", saved)
			}
			b.step(next, nil)
		})
	}
}

// TestLookupNeedsEveryChunk: a block one of whose values is gone is not
// matched.
func TestLookupNeedsEveryChunk(t *testing.T) {
	mem := newMem(t)
	extra := map[string]any{"layer_chunks": 3, "lookup": "sync"}
	a := newLWRig(t, mem, connector.BlockMajor, extra)
	req := request("r", 3*bs+1)
	a.prefill(req, 4)
	if err := mem.Remove(context.Background(), mustNS(t).LayerKey(0, 0, req.Hashes[1], 1, 2)); err != nil {
		t.Fatal(err)
	}
	b := newLWRig(t, mem, connector.BlockMajor, extra)
	if got := b.match(req); got != bs {
		t.Fatalf("Match = %d tokens with block 1's middle chunk gone, want %d", got, bs)
	}
}

// failsPuts fails every put with a transfer error.
type failsPuts struct{ store.Store }

func (failsPuts) Put(_ context.Context, keys []string, _ []rdma.Region, res []store.Result) error {
	for i := range keys {
		res[i] = store.Result{Err: store.ErrTransfer}
	}
	return nil
}

// TestChunkedStatsCountBlocks: a block stored as several values counts
// once in the worker's Stats, however many of its values failed or went
// stale.
func TestChunkedStatsCountBlocks(t *testing.T) {
	for _, chunks := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("chunks=%d", chunks), func(t *testing.T) {
			extra := map[string]any{"layer_chunks": chunks}
			ctx := context.Background()

			// Two blocks whose every put fails.
			r := newLWRig(t, failsPuts{newMem(t)}, connector.BlockMajor, extra)
			req := request("r", 2*bs+1)
			if err := r.s.Scheduled(req, req.Prompt, blocks(3)); err != nil {
				t.Fatal(err)
			}
			if err := r.w.Start(ctx, r.s.Plan()); err != nil {
				t.Fatal(err)
			}
			if err := r.w.Save(ctx, connector.Ready); err != nil {
				t.Fatal(err)
			}
			waitDone(t, r.w)
			if got := r.w.(connector.StatsReporter).Stats().SaveFailures; got != 2 {
				t.Errorf("SaveFailures = %d after 2 blocks failed to save, want 2", got)
			}

			// One block whose save goes stale: its step's event fires only
			// after a Start of a newer generation.
			r2 := newLWRig(t, newMem(t), connector.BlockMajor, extra)
			req2 := request("s", bs+1)
			if err := r2.s.Scheduled(req2, req2.Prompt, blocks(2)); err != nil {
				t.Fatal(err)
			}
			if err := r2.w.Start(ctx, r2.s.Plan()); err != nil {
				t.Fatal(err)
			}
			ev := &notYet{}
			if err := r2.w.Save(ctx, ev); err != nil {
				t.Fatal(err)
			}
			if err := r2.s.(connector.Rotator).Rotate(1); err != nil {
				t.Fatal(err)
			}
			if err := r2.w.Start(ctx, r2.s.Plan()); err != nil {
				t.Fatal(err)
			}
			ev.fire()
			waitDone(t, r2.w)
			if got := r2.w.(connector.StatsReporter).Stats().StaleDiscarded; got != 1 {
				t.Errorf("StaleDiscarded = %d after 1 block's save went stale, want 1", got)
			}
		})
	}
}

// waitDone polls w until it reports a transfer done: its Stats count
// the transfer by then.
func waitDone(t *testing.T, w connector.Worker) {
	t.Helper()
	for d := newDeadline(t, "a transfer reported done"); len(w.Poll().Done) == 0; d.tick() {
	}
}
