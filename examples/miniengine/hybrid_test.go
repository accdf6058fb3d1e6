package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/store"
)

// smallHybrid is small with the hybrid model: a window of 12 tokens over
// blocks of 8.
func smallHybrid(t *testing.T) Options {
	t.Helper()
	o := small(t)
	o.Kind, o.Model.Layers, o.Window = "hybrid", 3, 12
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestHybridReport(t *testing.T) {
	o := smallHybrid(t)
	o.ColdStart = true
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{"model: hybrid", "outputs identical: yes", "eviction pressure", "cold start"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestHybridScenarios runs the hybrid model through the scenarios of the
// transformer's tests: eviction pressure, two instances, a cold start,
// store faults, an online weight update and a corrupting store; every
// output is the connector-off run's.
func TestHybridScenarios(t *testing.T) {
	o := smallHybrid(t)
	offP := mustRun(t, o, false, o.PressureBlocks)
	offB := mustRun(t, o, false, o.Blocks)
	mustSame(t, "the two pools", offP, offB)
	t.Run("pressure", func(t *testing.T) {
		on := mustRun(t, o, true, o.PressureBlocks)
		mustSame(t, "pressure", offP, on)
		if on.ExternalTokens == 0 || on.ComputedTokens >= offP.ComputedTokens {
			t.Errorf("ON: %d external tokens, %d computed (OFF %d); want external hits and less compute", on.ExternalTokens, on.ComputedTokens, offP.ComputedTokens)
		}
	})
	t.Run("two instances", func(t *testing.T) {
		o := o
		o.Instances = 2
		on := mustRun(t, o, true, o.Blocks)
		mustSame(t, "two instances", offB, on)
		if on.ExternalTokens == 0 {
			t.Errorf("two instances: no external hits; each turn's history was saved by the other instance")
		}
	})
	t.Run("cold start", func(t *testing.T) {
		r, err := coldStart(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		mustSame(t, "cold start", offB, r.stats)
		if r.stats.ExternalTokens == 0 || 2*r.stats.ComputedTokens > offB.ComputedTokens {
			t.Errorf("cold start: %d external tokens, %d computed; an instance without a store computes %d: want at most half",
				r.stats.ExternalTokens, r.stats.ComputedTokens, offB.ComputedTokens)
		}
	})
	t.Run("faults", func(t *testing.T) {
		o := o
		o.FaultRate = 0.3
		on := mustRun(t, o, true, o.PressureBlocks)
		mustSame(t, "faults", offP, on)
		if on.ConnFailures == 0 {
			t.Errorf("faults at rate 0.3: no transfer failure counted")
		}
	})
	t.Run("weight update", func(t *testing.T) {
		o := o
		o.WeightUpdateAt = 3
		on := mustRun(t, o, true, o.PressureBlocks)
		checked := 0
		for k, gen := range on.gens {
			if gen != 1 {
				continue
			}
			checked++
			if got, want := on.outputs[k], fresh(t, o, on.prompts[k]); !slices.Equal(got, want) {
				t.Errorf("session %d turn %d after the update: output %v, a fresh engine on the new weights gives %v", k.Session, k.Turn, got, want)
			}
		}
		if checked == 0 {
			t.Fatalf("no request was submitted after the update")
		}
	})
	t.Run("corruption", func(t *testing.T) {
		o := o
		o.Verify = "none"
		o.wrapStore = func(s store.Store) store.Store { return corrupter{s} }
		on := mustRun(t, o, true, o.PressureBlocks)
		if on.ExternalTokens == 0 {
			t.Fatal("no external hits: the corruption was never served")
		}
		if _, same := sameOutputs(offP, on); same {
			t.Errorf("outputs identical although every loaded block (KV and states) was corrupted")
		}
		o.Verify = "checksum"
		on = mustRun(t, o, true, o.PressureBlocks)
		mustSame(t, "corrupted store, verified", offP, on)
		if on.ExternalTokens != 0 || on.ConnCorrupt == 0 {
			t.Errorf("verified: %d external tokens, %d corrupt blocks; want none served, some caught", on.ExternalTokens, on.ConnCorrupt)
		}
	})
}

// TestHybridRejected: options the hybrid model cannot run with are
// refused, naming the flag.
func TestHybridRejected(t *testing.T) {
	for name, edit := range map[string]func(*Options){
		"layers": func(o *Options) { o.Model.Layers = 2 },
		"window": func(o *Options) { o.Window = 0 },
		"batch":  func(o *Options) { o.Batch = o.Block - 1 },
		"pd":     func(o *Options) { o.PD = true },
		"model":  func(o *Options) { o.Kind = "mamba" },
	} {
		o := defaultOptions()
		o.Kind, o.Model.Layers = "hybrid", 3
		edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "-"+name) {
			t.Errorf("%s: Validate() = %v, want an error naming -%s", name, err, name)
		}
	}
}
