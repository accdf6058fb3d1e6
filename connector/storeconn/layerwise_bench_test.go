package storeconn_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// The TTFT benchmark's model: 8 layers, a 16-block prefix of 16 tokens
// per block, 4 KiB per layer and block for each of K and V (1 MiB in all),
// over a link of 32 MiB/s with 200 µs per call: the whole prefix takes
// 32 ms to load, a layer of it 4 ms, as long as the benchmark's compute
// of one layer.
const (
	ttftLayers     = 8
	ttftBlocks     = 16
	ttftBlockBytes = 4 << 10
	ttftBandwidth  = 32 << 20
	ttftLatency    = 200 * time.Microsecond
	ttftLayerTime  = 4 * time.Millisecond
)

func ttftIdentity() hashing.Identity {
	id := benchIdentity()
	id.Layout.Layers = ttftLayers
	return id
}

// ttftRig is one engine instance: a scheduler half and a worker over st.
type ttftRig struct {
	b   *testing.B
	s   connector.Planner
	w   connector.Worker
	blk []connector.BlockID
	req *connector.Request
	n   int
}

func newTTFTRig(b *testing.B, st store.Store, chunks int) *ttftRig {
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync", "layer_chunks": chunks}}
	env := connector.Env{Identity: ttftIdentity(), Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		b.Fatal(err)
	}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		b.Fatal(err)
	}
	kv := connector.KVCache{Layers: ttftLayers, Blocks: ttftBlocks + 1, KV: 2, BlockBytes: ttftBlockBytes, Order: connector.BlockMajor}
	m, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		b.Fatal(err)
	}
	kv.Regions = []rdma.Region{m.Region()}
	if err := w.Register(kv); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		w.Close()
		s.Close()
		m.Free()
	})
	toks := make([]hashing.Token, ttftBlocks*16+1)
	for i := range toks {
		toks[i] = hashing.Token(i * 3)
	}
	hs, err := hashing.HashBlocks(16, toks[:ttftBlocks*16])
	if err != nil {
		b.Fatal(err)
	}
	r := &ttftRig{b: b, s: s, w: w, req: &connector.Request{Prompt: len(toks), Hashes: hs}}
	for i := range ttftBlocks + 1 {
		r.blk = append(r.blk, connector.BlockID(i))
	}
	return r
}

// compute stands for the forward pass of one layer on an accelerator,
// which the host only waits for.
func compute() { time.Sleep(ttftLayerTime) }

// step runs one step; with layers, layer by layer.
func (r *ttftRig) step(layers bool) *connector.Progress {
	ctx := context.Background()
	m := r.s.Plan()
	want := len(m.Loads) + len(m.Saves)
	if err := r.w.Start(ctx, m); err != nil {
		r.b.Fatal(err)
	}
	if layers {
		lw := r.w.(connector.LayerWorker)
		for l := range ttftLayers {
			if err := lw.WaitLayer(ctx, l); err != nil {
				r.b.Fatal(err)
			}
			compute()
			if err := lw.SaveLayer(ctx, l, connector.Ready); err != nil {
				r.b.Fatal(err)
			}
		}
	}
	if err := r.w.Save(ctx, connector.Ready); err != nil {
		r.b.Fatal(err)
	}
	var p *connector.Progress
	for got := 0; ; {
		o := r.w.Poll()
		if len(o.Failed) > 0 {
			r.b.Fatalf("failures: %+v", o.Failed)
		}
		got += len(o.Done)
		var err error
		if p, err = r.s.Update([]*connector.Output{o}); err != nil {
			r.b.Fatal(err)
		}
		if got >= want {
			return p
		}
		<-r.w.(connector.Waker).Wake()
	}
}

// ttft serves one request whose prefix is in the store, up to its first
// token: whole-block (load, then a step that computes every layer) or
// layer-wise (one step whose layers wait for their loads).
func (r *ttftRig) ttft(layers bool) time.Duration {
	r.n++
	req := *r.req
	req.ID = connector.RequestID(fmt.Sprint(r.n))
	start := time.Now()
	m, err := r.s.Match(&req, 0)
	if err != nil || m.Tokens != ttftBlocks*16 {
		r.b.Fatalf("Match = %+v, %v", m, err)
	}
	if err := r.s.Allocated(&req, m.Tokens, r.blk); err != nil {
		r.b.Fatal(err)
	}
	if layers {
		if err := r.s.Scheduled(&req, req.Prompt, r.blk); err != nil {
			r.b.Fatal(err)
		}
		if p := r.step(true); !slices.Contains(p.Loaded, req.ID) {
			r.b.Fatalf("the layer-wise step did not load %s: %+v", req.ID, p)
		}
	} else {
		if p := r.step(false); !slices.Contains(p.Loaded, req.ID) {
			r.b.Fatalf("the load step did not load %s: %+v", req.ID, p)
		}
		if err := r.s.Scheduled(&req, req.Prompt, r.blk); err != nil {
			r.b.Fatal(err)
		}
		for range ttftLayers {
			compute()
		}
		r.step(false)
	}
	d := time.Since(start)
	if keep, err := r.s.Finish(&req, r.blk); err != nil || keep {
		r.b.Fatalf("Finish = %v, %v", keep, err)
	}
	return d
}

// BenchmarkLayerwiseTTFT measures the time to first token of a request
// whose 16-block prefix loads from a store that adds latency per call and
// moves bytes at a fixed bandwidth (storetest's Faulty), where loading
// one layer of the prefix takes as long as computing it: whole-block
// (every layer loads, then the step computes) against layer-wise (a
// value per chunks of layers: the step computes layer l as soon as its
// chunk is in), for 2, 4 and 8 chunks of the 8 layers. Both alternate in
// every iteration; ratio is the median layer-wise TTFT over the median
// whole-block one. Target <= 0.7x.
func BenchmarkLayerwiseTTFT(b *testing.B) {
	for _, chunks := range []int{2, 4, ttftLayers} {
		b.Run(fmt.Sprintf("chunks=%d", chunks), func(b *testing.B) {
			mem, err := memstore.New(memstore.Config{Capacity: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer mem.Close()
			link := storetest.NewFaulty(mem, storetest.FaultOptions{Latency: ttftLatency, Bandwidth: ttftBandwidth})
			whole, layered := newTTFTRig(b, link, 1), newTTFTRig(b, link, chunks)
			// Store the prefix in both layouts, through the fast path.
			for _, c := range []int{1, chunks} {
				seed := newTTFTRig(b, mem, c)
				seed.save()
			}
			var ws, ls []time.Duration
			for b.Loop() {
				ws = append(ws, whole.ttft(false))
				ls = append(ls, layered.ttft(true))
			}
			mw, ml := median(ws), median(ls)
			b.ReportMetric(float64(mw.Microseconds())/1e3, "whole-ttft-ms")
			b.ReportMetric(float64(ml.Microseconds())/1e3, "layerwise-ttft-ms")
			b.ReportMetric(float64(ml)/float64(mw), "ratio")
		})
	}
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// save computes and saves the rig's prompt as a new request, and returns
// how long the saves took once the step was ready.
func (r *ttftRig) save() time.Duration {
	r.n++
	req := *r.req
	req.ID = connector.RequestID(fmt.Sprint("save", r.n))
	if err := r.s.Scheduled(&req, ttftBlocks*16, r.blk); err != nil {
		r.b.Fatal(err)
	}
	start := time.Now()
	r.step(false)
	d := time.Since(start)
	if keep, err := r.s.Finish(&req, r.blk); err != nil || keep {
		r.b.Fatalf("Finish = %v, %v", keep, err)
	}
	return d
}

// BenchmarkLayerChunksSave measures what storing a block as a value per
// layer costs against one value per block, over memstore with no latency:
// saves of the 16-block, 1 MiB prefix, each to a fresh store so that
// every put stores, alternating the two in every iteration. ratio is the
// median time with 8 values per block over the median with 1.
func BenchmarkLayerChunksSave(b *testing.B) {
	fresh := func() store.Store {
		mem, err := memstore.New(memstore.Config{Capacity: 64 << 20})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mem.Close() })
		return mem
	}
	var ws, ls []time.Duration
	for b.Loop() {
		b.StopTimer()
		whole, layered := newTTFTRig(b, fresh(), 1), newTTFTRig(b, fresh(), ttftLayers)
		b.StartTimer()
		ws = append(ws, whole.save())
		ls = append(ls, layered.save())
	}
	mw, ml := median(ws), median(ls)
	b.ReportMetric(float64(mw.Microseconds()), "whole-us")
	b.ReportMetric(float64(ml.Microseconds()), "per-layer-us")
	b.ReportMetric(float64(ml)/float64(mw), "ratio")
}
