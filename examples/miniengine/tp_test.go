package main

import (
	"math"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestShardsSumToWhole computes a sequence with the whole model and with
// its heads split over 2 and 4 ranks: after every layer's all-reduce the
// shards' hidden state is the whole model's, to float32 rounding (the sum
// is grouped by rank), and each shard's KV is its columns of the whole
// model's KV.
func TestShardsSumToWhole(t *testing.T) {
	cfg := ModelConfig{Vocab: 64, Dim: 32, Heads: 4, Layers: 3, FFN: 64, Seed: 5}
	m := NewModel(cfg)
	const bs, blocks = 8, 8
	alloc := func(dim int) *KV {
		l := KVLayout{Layers: cfg.Layers, Dim: dim, BlockSize: bs, Blocks: blocks}
		mem, err := rdma.AllocHost(l.Blocks * l.Layers * 2 * l.BlockBytes())
		if err != nil {
			t.Skipf("no host memory: %v", err)
		}
		t.Cleanup(func() { mem.Free() })
		return NewKV(l, mem.Region())
	}
	table := []connector.BlockID{3, 1, 7, 0, 5, 2, 6, 4}
	var toks []hashing.Token
	for i := range 40 {
		toks = append(toks, hashing.Token(i*7%cfg.Vocab))
	}
	whole := alloc(cfg.Dim)
	ref := m.Begin(whole, table, toks, 0, len(toks), 1)
	for l := range cfg.Layers {
		ref.Layer(l)
	}
	for _, tp := range []int{2, 4} {
		var kvs []*KV
		var passes []*Pass
		for r := range tp {
			kvs = append(kvs, alloc(cfg.Dim/tp))
			passes = append(passes, m.BeginShard(kvs[r], table, toks, 0, len(toks), 2, Shard{Rank: r, TP: tp}))
		}
		sum := make([]float32, len(toks)*cfg.Dim)
		for l := range cfg.Layers {
			clear(sum)
			for _, p := range passes {
				addTo(sum, p.Attend(l))
			}
			for _, p := range passes {
				p.Finish(l, sum)
			}
		}
		for r, p := range passes {
			if d := maxRelDiff(ref.x, p.x); d > 1e-4 {
				t.Errorf("tp %d rank %d: hidden state differs from the whole model's by %.2g (relative)", tp, r, d)
			}
			if p.Token() != ref.Token() {
				t.Errorf("tp %d rank %d: token %d, the whole model's %d", tp, r, p.Token(), ref.Token())
			}
			// Rank r's K and V are columns [r·Dim/tp, (r+1)·Dim/tp) of the whole model's.
			dr := cfg.Dim / tp
			for l := range cfg.Layers {
				for kv := range 2 {
					for pos := range toks {
						got := kvs[r].slot(table, l, kv, pos)
						want := whole.slot(table, l, kv, pos)[r*dr : (r+1)*dr]
						if d := maxRelDiff(want, got); d > 1e-4 {
							t.Fatalf("tp %d rank %d layer %d kv %d position %d: KV differs from the whole model's columns by %.2g", tp, r, l, kv, pos, d)
						}
					}
				}
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("BeginShard of 3 ranks over 4 heads did not panic")
		}
	}()
	m.BeginShard(alloc(cfg.Dim/4), table, toks, 0, 8, 1, Shard{Rank: 0, TP: 3})
}

// maxRelDiff returns the largest |a-b| over the largest |a|.
func maxRelDiff(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
		n = max(n, math.Abs(float64(a[i])))
	}
	return d / max(n, 1e-30)
}

// TestTensorParallel runs the workload with the heads over 2 ranks, under
// eviction pressure: connector on and off generate the same tokens, each
// rank saves and loads its own shard's keys.
func TestTensorParallel(t *testing.T) {
	o := small(t)
	o.TP = 2
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	off := mustRun(t, o, false, o.PressureBlocks)
	on := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "tp 2 under pressure", off, on)
	if on.ExternalTokens == 0 || on.ConnLoads == 0 || on.ConnSaves == 0 {
		t.Errorf("tp 2 ON: %d external tokens, %d blocks loaded, %d saved; want all above 0", on.ExternalTokens, on.ConnLoads, on.ConnSaves)
	}
	if on.ConnSaves%2 != 0 {
		t.Errorf("tp 2 ON: %d block saves over 2 ranks, want an even count (each rank saves its shard of every block)", on.ConnSaves)
	}
}

func TestTensorParallelRejected(t *testing.T) {
	for name, c := range map[string]struct {
		edit func(*Options)
		want string
	}{
		"heads":     {func(o *Options) { o.TP = 3 }, "-tp = 3 does not divide -heads = 4"},
		"zero":      {func(o *Options) { o.TP = 0 }, "-tp = 0, want >= 1"},
		"hybrid":    {func(o *Options) { o.TP, o.Kind, o.Model.Layers = 2, "hybrid", 3 }, "-model hybrid"},
		"layerwise": {func(o *Options) { o.TP, o.Layerwise = 2, true }, "-layerwise"},
		"pd":        {func(o *Options) { o.TP, o.PD = 2, true }, "-pd"},
		"procs":     {func(o *Options) { o.TPProcs = true }, "-tp-procs needs -tp 2 or more"},
		"mooncake":  {func(o *Options) { o.TP, o.TPProcs, o.Store = 2, true, "mooncake" }, "-tp-procs with -store mooncake"},
	} {
		o := defaultOptions()
		c.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", name, err, c.want)
		}
	}
}
