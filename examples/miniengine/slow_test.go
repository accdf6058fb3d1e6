package main

import (
	"context"
	"slices"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// TestPrefillRateGate: with -prefill-rate above any rate the store's
// loads reach, the connector stops counting the blocks it finds once it
// has measured a load, so the run loads fewer tokens than without the
// gate, and generates the same tokens as the run without a connector.
func TestPrefillRateGate(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.PressureBlocks)
	open := mustRun(t, o, true, o.PressureBlocks)
	o.PrefillRate = 1 << 40
	gated := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "gated", off, gated)
	if gated.ExternalTokens >= open.ExternalTokens {
		t.Errorf("tokens loaded with the gate shut: %d, without it %d; want fewer", gated.ExternalTokens, open.ExternalTokens)
	}
	t.Logf("external tokens: %d without the gate, %d with it", open.ExternalTokens, gated.ExternalTokens)
}

// slowReads is a store whose gets go over a slow link (slow, a Faulty
// over the same store) and whose puts do not: a tier slow to read, such
// as a disk under contention.
type slowReads struct {
	store.Store
	slow store.Store
}

func (s slowReads) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return s.slow.Get(ctx, keys, dst, res)
}

// BenchmarkSlowStoreTTFT runs the workload under eviction pressure over a
// store that reads values at 1 MiB/s, far slower than the mini-engine
// recomputes: without a connector, with one, and with one told the
// engine's prefill speed (-prefill-rate, measured as the run without a
// connector's computed tokens per second). It reports each connector
// run's mean TTFT over the run without (medians over iterations): the
// gated run should be near 1, the other above it.
func BenchmarkSlowStoreTTFT(b *testing.B) {
	o := defaultOptions()
	o.Workload = Workload{Sessions: 4, System: 32, FirstTurn: 96, Growth: 32, Output: 4, Turns: 6, Seed: 3}
	o.Model.Dim, o.Model.FFN = 32, 64
	o.Block, o.Par, o.Progress = 8, 2, false
	o.wrapStore = func(s store.Store) store.Store {
		return slowReads{Store: s, slow: storetest.NewFaulty(s, storetest.FaultOptions{Bandwidth: 1 << 20})}
	}
	if err := o.Validate(); err != nil {
		b.Fatal(err)
	}
	run := func(o Options, on bool) Stats {
		st, err := runOnce(context.Background(), o, on, o.PressureBlocks, nil)
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	var open, gated []float64
	for b.Loop() {
		off := run(o, false)
		on := run(o, true)
		g := o
		g.PrefillRate = max(1, int(float64(off.ComputedTokens)/off.Duration.Seconds()))
		gt := run(g, true)
		open = append(open, float64(on.TTFT)/float64(off.TTFT))
		gated = append(gated, float64(gt.TTFT)/float64(off.TTFT))
	}
	b.ReportMetric(medianOf(open), "ttft-on/off")
	b.ReportMetric(medianOf(gated), "ttft-gated/off")
}

func medianOf(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}
