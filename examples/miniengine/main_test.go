package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// small is a workload that runs in a fraction of a second.
func small(t *testing.T) Options {
	t.Helper()
	o := defaultOptions()
	o.Workload = Workload{Sessions: 3, System: 32, FirstTurn: 96, Growth: 32, Output: 4, Turns: 3, Seed: 3}
	o.Model.Dim, o.Model.FFN = 32, 64
	o.Block = 8
	o.Par = 2
	o.Progress = false
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

func mustRun(t *testing.T, o Options, on bool, blocks int) Stats {
	t.Helper()
	st, err := runOnce(context.Background(), o, on, blocks, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Failed != 0 || st.Succeeded != o.Workload.Sessions*o.Workload.Turns {
		t.Fatalf("%d succeeded, %d failed; want %d and 0", st.Succeeded, st.Failed, o.Workload.Sessions*o.Workload.Turns)
	}
	return st
}

func mustSame(t *testing.T, what string, a, b Stats) {
	t.Helper()
	if k, ok := sameOutputs(a, b); !ok {
		t.Fatalf("%s: outputs differ from the connector-off run at session %d turn %d", what, k.Session, k.Turn)
	}
}

func TestMainReport(t *testing.T) {
	o := small(t)
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main: %v\n%s", err, out.String())
	}
	for _, want := range []string{"outputs identical: yes", "eviction pressure", "KV hit rate, external", "subsequent-turn TTFT"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	o.JSON = true
	out.Reset()
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Runs      []Run `json:"runs"`
		Identical bool  `json:"outputs_identical"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res.Runs) != 4 || !res.Identical {
		t.Fatalf("-json: %v, %d runs, identical %v:\n%s", err, len(res.Runs), res.Identical, out.String())
	}
}

func TestOptionsRejected(t *testing.T) {
	for name, edit := range map[string]func(*Options){
		"sessions":   func(o *Options) { o.Workload.Sessions = 0 },
		"heads":      func(o *Options) { o.Model.Heads = 3 },
		"fault-rate": func(o *Options) { o.FaultRate = 2 },
		"blocks":     func(o *Options) { o.Blocks = 1 },
	} {
		o := defaultOptions()
		edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), strings.SplitN(name, "-", 2)[0]) {
			t.Errorf("%s: Validate() = %v, want an error naming it", name, err)
		}
	}
}

// TestPressure: with a small pool, the connector serves most prompt tokens
// from the store, computes fewer, and changes no output.
func TestPressure(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.PressureBlocks)
	on := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "pressure", off, on)
	if on.ExternalTokens == 0 || on.ComputedTokens >= off.ComputedTokens {
		t.Errorf("ON: %d external tokens, %d computed (OFF %d); want external hits and less compute", on.ExternalTokens, on.ComputedTokens, off.ComputedTokens)
	}
}

// TestTwoInstances: two engines share one store; turns alternate between
// them, so each turn's history was computed by the other instance.
func TestTwoInstances(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.Blocks)
	o.Instances = 2
	on := mustRun(t, o, true, o.Blocks)
	mustSame(t, "two instances", off, on)
	if on.ExternalTokens == 0 {
		t.Errorf("two instances: no external hits; each turn's history was saved by the other instance")
	}
}

// TestColdStart: a new instance over a warm store serves the workload from
// the store.
func TestColdStart(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.Blocks)
	r, err := coldStart(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	mustSame(t, "cold start", off, r.stats)
	if r.stats.ExternalTokens == 0 || 2*r.stats.ComputedTokens > off.ComputedTokens {
		t.Errorf("cold start: %d external tokens, %d computed; an instance without a store computes %d: want at most half",
			r.stats.ExternalTokens, r.stats.ComputedTokens, off.ComputedTokens)
	}
}

// TestFaults: store faults change no output; they are counted.
func TestFaults(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.PressureBlocks)
	o.FaultRate = 0.3
	on := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "faults", off, on)
	if on.ConnFailures == 0 {
		t.Errorf("faults at rate 0.3: no transfer failure counted")
	}
}

// recorder is a store that records the order of the namespaces its lookups
// and loads touch.
type recorder struct {
	store.Store
	mu   sync.Mutex
	seen []string // namespace prefix of each Exists or Get key, in order
}

func (r *recorder) note(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		k, err := hashing.ParseKey(k)
		if err == nil {
			r.seen = append(r.seen, k.Namespace)
		}
	}
}

func (r *recorder) Exists(ctx context.Context, keys []string, res []store.Result) error {
	r.note(keys)
	return r.Store.Exists(ctx, keys, res)
}

func (r *recorder) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	r.note(keys)
	return r.Store.Get(ctx, keys, dst, res)
}

// TestWeightUpdate: after an online weight update, no key of the old
// generation is looked up or loaded, and every request submitted after it
// generates what a fresh engine on the new weights generates.
func TestWeightUpdate(t *testing.T) {
	o := small(t)
	o.WeightUpdateAt = 3
	rec := &recorder{}
	o.wrapStore = func(s store.Store) store.Store { rec.Store = s; return rec }
	on := mustRun(t, o, true, o.PressureBlocks)
	ns0, _ := o.identity(0).Namespace()
	ns1, _ := o.identity(1).Namespace()
	first1 := slices.Index(rec.seen, ns1.ID())
	if first1 < 0 {
		t.Fatalf("no lookup of generation 1 keys")
	}
	if i := slices.Index(rec.seen[first1:], ns0.ID()); i >= 0 {
		t.Errorf("a generation 0 key was looked up or loaded after generation 1's first lookup (at %d)", first1+i)
	}
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
}

// fresh generates the output of prompt on a new engine with the new weights
// and no connector.
func fresh(t *testing.T, o Options, prompt []hashing.Token) []hashing.Token {
	t.Helper()
	cfg := o.engineConfig(1, o.Blocks)
	cfg.Par = 1
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	done := make(chan finished, 1)
	if err := e.Submit("fresh", prompt, o.Workload.Output, nil, done); err != nil {
		t.Fatal(err)
	}
	for e.Busy() {
		if err := e.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return (<-done).Out
}

// corrupter flips a bit in the exponent of every float of every value it
// serves: KV that looks like KV but is not what the model computed.
type corrupter struct{ store.Store }

func (c corrupter) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	err := c.Store.Get(ctx, keys, dst, res)
	for i, r := range res {
		if err == nil && r.Err == nil {
			b := dst[i].Bytes()[:r.N]
			for j := 3; j < len(b); j += 4 {
				b[j] ^= 0x01
			}
		}
	}
	return err
}

// TestCorruptionChangesOutputs proves the end-to-end check can fail: KV
// that is not what the model computed changes what it generates, when the
// connector does not verify what it loads.
func TestCorruptionChangesOutputs(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.PressureBlocks)
	o.Verify = "none"
	o.wrapStore = func(s store.Store) store.Store { return corrupter{s} }
	on := mustRun(t, o, true, o.PressureBlocks)
	if on.ExternalTokens == 0 {
		t.Fatal("no external hits: the corruption was never served")
	}
	if _, same := sameOutputs(off, on); same {
		t.Errorf("outputs identical although every loaded block was corrupted")
	}
}

// TestCorruptionCaught: with verification (the default) the same corrupted
// values are refused: every one is counted, none is served, and the
// outputs are those of an engine without a connector.
func TestCorruptionCaught(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.PressureBlocks)
	o.wrapStore = func(s store.Store) store.Store { return corrupter{s} }
	on := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "corrupted store, verified", off, on)
	if on.ExternalTokens != 0 || on.ConnLoads != 0 {
		t.Errorf("%d external tokens and %d blocks loaded from a store that corrupts every value; want none", on.ExternalTokens, on.ConnLoads)
	}
	if on.ConnCorrupt == 0 || on.ConnCorrupt != on.ConnFailures {
		t.Errorf("%d blocks failed verification of %d failed transfers; want every failure to be a verification failure, and some", on.ConnCorrupt, on.ConnFailures)
	}
}

// TestPrefillDecode: a prefill instance hands every request's KV to a
// decode instance over the loopback transfer engine; the decode instance
// loads it and generates exactly what one instance does.
func TestPrefillDecode(t *testing.T) {
	o := small(t)
	off := mustRun(t, o, false, o.Blocks)
	r, err := runPD(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	mustSame(t, "prefill/decode", off, r.stats)
	if r.BlocksLoaded == 0 || r.LoadBytes == 0 {
		t.Errorf("prefill/decode: %d blocks, %d bytes transferred; want the prompts' blocks", r.BlocksLoaded, r.LoadBytes)
	}
	if r.Failed != 0 || r.Failures != 0 {
		t.Errorf("prefill/decode: %d requests failed, %d blocks failed to transfer; want none", r.Failed, r.Failures)
	}
}

// removals records the prefixes a store is asked to remove.
type removals struct {
	store.Store
	prefixes []string
}

func (r *removals) RemovePrefix(ctx context.Context, p string) (int, error) {
	r.prefixes = append(r.prefixes, p)
	return r.Store.RemovePrefix(ctx, p)
}

// TestTenantFlag: by default each ON run over a shared store has a tenant
// of its own, removed after it; -tenant fixes the tenant of every run and
// keeps its keys, so another run or process is served from them.
func TestTenantFlag(t *testing.T) {
	m, err := memstore.New(memstore.Config{Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rec := &removals{Store: m}
	o := small(t)
	o.shared, o.runs = rec, new(int)
	r := o.forRun()
	_, purge, err := r.newStore()
	if err != nil {
		t.Fatal(err)
	}
	if err := purge(); err != nil {
		t.Fatal(err)
	}
	if len(rec.prefixes) != 1 || !strings.HasPrefix(rec.prefixes[0], "miniengine-") {
		t.Fatalf("default run removed %q, want its own fresh tenant", rec.prefixes)
	}
	o.Tenant = "kept"
	off := mustRun(t, o, false, o.Blocks)
	on := mustRun(t, o, true, o.Blocks)
	mustSame(t, "-tenant kept", off, on)
	if len(rec.prefixes) != 1 {
		t.Errorf("a run with -tenant removed %q; want its keys kept", rec.prefixes[1:])
	}
	if n, err := m.RemovePrefix(context.Background(), hashing.TenantPrefix("kept")); err != nil || n == 0 {
		t.Errorf("keys of tenant kept after the run: %d, %v; want the run's saves", n, err)
	}
	if s := m.Stats().Keys; s != 0 {
		t.Errorf("%d keys outside tenant kept", s)
	}
	// A second run of the same tenant is served from the first's keys.
	o.Tenant = "again"
	mustRun(t, o, true, o.Blocks)
	second := mustRun(t, o, true, o.Blocks)
	if second.ExternalTokens == 0 {
		t.Errorf("a second run of tenant again loaded nothing from the first's keys")
	}
	if o.Keep = true; o.Validate() == nil {
		t.Errorf("-keep with the embedded store: Validate() = nil, want an error")
	}
}

// TestLayerwise: with -layerwise every step is computed layer by layer,
// each block is stored as a value per layer, and a request whose prefix
// is in the store runs in the step of its load. The outputs equal the
// connector-off run's (whole-layer compute, no connector), under
// pressure, across two instances, and over a store that fails keys at
// random, where a request whose load failed has its step discarded.
func TestLayerwise(t *testing.T) {
	o := small(t)
	o.Model.Layers = 3
	off := mustRun(t, o, false, o.PressureBlocks)
	lw := o
	lw.Layerwise = true
	if err := lw.Validate(); err != nil {
		t.Fatal(err)
	}
	on := mustRun(t, lw, true, o.PressureBlocks)
	mustSame(t, "layer-wise under pressure", off, on)
	if on.ExternalTokens == 0 || on.InlineLoads == 0 {
		t.Errorf("layer-wise under pressure: %d external tokens, %d loads in the step of their request; want both", on.ExternalTokens, on.InlineLoads)
	}
	lw.Instances = 2
	mustSame(t, "layer-wise, two instances", off, mustRun(t, lw, true, o.Blocks))
	lw.Instances = 1
	lw.FaultRate = 0.2
	faulty := mustRun(t, lw, true, o.PressureBlocks)
	mustSame(t, "layer-wise with faults", off, faulty)
	if faulty.ExternalTokens == 0 || faulty.ConnFailures == 0 {
		t.Errorf("layer-wise with faults: %d external tokens, %d failed transfers; want both", faulty.ExternalTokens, faulty.ConnFailures)
	}
	// Which loads fail depends on which lookups failed first: the
	// scheduler package's test is the one that requires discarded steps.
	t.Logf("layer-wise with faults: %d loads in the step of their request, %d of those steps discarded", faulty.InlineLoads, faulty.DiscardedSteps)
	pd := small(t)
	pd.Layerwise, pd.PD = true, true
	if err := pd.Validate(); err == nil || !strings.Contains(err.Error(), "-layerwise with -pd") {
		t.Errorf("-layerwise -pd: Validate() = %v, want an error naming both", err)
	}
	hybrid := small(t)
	hybrid.Kind, hybrid.Model.Layers, hybrid.Layerwise = "hybrid", 3, true
	if err := hybrid.Validate(); err == nil || !strings.Contains(err.Error(), "-layerwise") {
		t.Errorf("-layerwise with -model hybrid: Validate() = %v, want an error naming -layerwise", err)
	}
}

// TestJSONVerdicts: -json carries a verdict per run and repeat and the
// verification-failure count, as the text report does; with outputs that
// differ it reports which runs differ and ends with an error, as the text
// mode does (and neither keeps a client up then).
func TestJSONVerdicts(t *testing.T) {
	type report struct {
		Runs      []Run     `json:"runs"`
		Identical bool      `json:"outputs_identical"`
		Verdicts  []Verdict `json:"verdicts"`
	}
	run := func(o Options) (report, error) {
		t.Helper()
		o.JSON = true
		var out, errw bytes.Buffer
		err := Main(context.Background(), o, &out, &errw)
		var rep report
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("-json: %v (Main: %v):\n%s", jerr, err, out.String())
		}
		return rep, err
	}

	o := small(t)
	o.Repeat = 2
	o.wrapStore = func(s store.Store) store.Store { return corrupter{s} }
	rep, err := run(o)
	if err != nil || !rep.Identical {
		t.Fatalf("verified corrupted store: Main = %v, identical %v; want nil, true", err, rep.Identical)
	}
	if len(rep.Verdicts) != 8 {
		t.Fatalf("%d verdicts, want 8 (4 runs x 2 repeats): %+v", len(rep.Verdicts), rep.Verdicts)
	}
	for _, v := range rep.Verdicts {
		if !v.Identical || v.Repeat < 1 || v.Repeat > 2 {
			t.Errorf("verdict %+v, want identical, repeat 1 or 2", v)
		}
	}
	if rep.Runs[3].Corrupt == 0 {
		t.Errorf("eviction pressure, connector on: verification_failures = 0 with a store that corrupts every value")
	}

	o.Repeat = 1
	o.Verify = "none"
	rep, err = run(o)
	if err == nil || rep.Identical {
		t.Fatalf("unverified corrupted store: Main = %v, identical %v; want an error, false", err, rep.Identical)
	}
	differ := 0
	for _, v := range rep.Verdicts {
		if !v.Identical {
			differ++
			if v.Differs == "" {
				t.Errorf("verdict %+v names no differing turn", v)
			}
		}
	}
	if differ == 0 {
		t.Errorf("no verdict says the outputs differ: %+v", rep.Verdicts)
	}
}
