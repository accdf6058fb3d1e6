package prom_test

import (
	"context"
	_ "embed"
	"encoding/json"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store/memstore"
)

//go:embed dashboard.json
var dashboard []byte

// metricName matches a metric name of the package in a query.
var metricName = regexp.MustCompile(`\bkvconnect_[a-zA-Z0-9_]+`)

// dashboardNames returns the metric names that the dashboard's queries
// (and template variables) name: every kvconnect_ name in a string of
// the JSON.
func dashboardNames(t *testing.T) []string {
	t.Helper()
	var doc any
	if err := json.Unmarshal(dashboard, &doc); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var names []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			names = append(names, metricName.FindAllString(v, -1)...)
		}
	}
	walk(doc)
	slices.Sort(names)
	return slices.Compact(names)
}

// scrapedNames returns the names of the series a scrape of mfs reads: a
// histogram's _bucket, _sum and _count.
func scrapedNames(mfs []*dto.MetricFamily) map[string]bool {
	have := map[string]bool{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		name := mf.GetName()
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				have[name+s] = true
			}
			continue
		}
		have[name] = true
	}
	return have
}

// TestDashboardNamesExist runs a store connector over an instrumented
// memstore for a few steps (a save, then a match and load of it), scrapes
// every collector of the package, and checks that each metric the
// dashboard's queries name is in the scrape.
func TestDashboardNamesExist(t *testing.T) {
	names := dashboardNames(t)
	if len(names) < 10 {
		t.Fatalf("dashboard.json names %d metrics (%v): the parser found too few", len(names), names)
	}
	mfs := liveScrape(t)
	have := scrapedNames(mfs)
	for _, n := range names {
		if !have[n] {
			t.Errorf("dashboard.json queries %s: not in a scrape of the package's collectors", n)
		}
	}
	t.Logf("the dashboard's %d metric names are all in the scrape", len(names))
}

// TestDashboardCheckFails: the check of TestDashboardNamesExist sees a
// name that no collector exports.
func TestDashboardCheckFails(t *testing.T) {
	have := scrapedNames(liveScrape(t))
	if have["kvconnect_store_operation_time_seconds_bucket"] || !have["kvconnect_store_operation_duration_seconds_bucket"] {
		t.Errorf("scrapedNames: vLLM's name present or the package's absent: %v", have)
	}
}

// liveScrape runs a scheduler half and one worker of the store connector
// over an instrumented memstore: a request is saved, a second with the
// same prompt matched and loaded; then it registers every collector of
// the package, labelled engine="e1", and gathers them.
func liveScrape(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	mem, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	opts := prom.Options{Labels: prometheus.Labels{"engine": "e1"}}
	st := prom.InstrumentStore(mem, opts)
	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
	env := connector.Env{Identity: id, Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	kvm, err := rdma.AllocHost(16 * 2 * 2 * 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		s.Close()
		kvm.Free()
	})
	if err := w.Register(connector.KVCache{Layers: 2, Blocks: 16, KV: 2, BlockBytes: 64, Order: connector.BlockMajor, Regions: []rdma.Region{kvm.Region()}}); err != nil {
		t.Fatal(err)
	}
	toks := make([]hashing.Token, 4*4+1)
	for i := range toks {
		toks[i] = hashing.Token(i)
	}
	hs, err := hashing.HashBlocks(4, toks)
	if err != nil {
		t.Fatal(err)
	}
	step := func() *connector.Progress {
		m := s.Plan()
		if err := w.Start(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		if err := w.Save(context.Background(), connector.Ready); err != nil {
			t.Fatal(err)
		}
		p, err := s.Update([]*connector.Output{w.Poll()})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	until := func(what string, cond func(*connector.Progress) bool) {
		for end := time.Now().Add(2 * time.Minute); !cond(step()); {
			if time.Now().After(end) {
				t.Fatalf("never, in 2m: %s", what)
			}
		}
	}
	released := func(id connector.RequestID) func(*connector.Progress) bool {
		return func(p *connector.Progress) bool { return slices.Contains(p.Released, id) }
	}
	a := &connector.Request{ID: "a", Prompt: len(toks), Hashes: hs, Tokens: toks}
	if err := s.Scheduled(a, a.Prompt, []connector.BlockID{0, 1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if keep, err := s.Finish(a); err != nil {
		t.Fatal(err)
	} else if keep {
		until("release of a", released("a"))
	}
	prefix := prom.NewExternalPrefixCache(opts)
	tokens := prom.NewPromptTokens(opts)
	b := &connector.Request{ID: "b", Prompt: len(toks), Hashes: hs}
	m, err := s.Match(b, 0)
	if err != nil || m.Tokens != 16 {
		t.Fatalf("Match(b) = %+v, %v; want 16 tokens", m, err)
	}
	prefix.Record(b.Prompt, m.Tokens)
	tokens.Add(prom.ExternalTransfer, m.Tokens)
	tokens.Add(prom.LocalCompute, b.Prompt-m.Tokens)
	if err := s.Allocated(b, m.Tokens, []connector.BlockID{5, 6, 7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	until("load of b", func(p *connector.Progress) bool { return slices.Contains(p.Loaded, "b") })
	if _, err := s.Finish(b); err != nil {
		t.Fatal(err)
	}
	sc := prom.NewScheduler(s, opts)
	sc.Refresh()
	reg := prometheus.NewPedanticRegistry()
	if err := prom.Register(reg, st, prom.NewStoreStats(mem, opts), sc, prom.NewWorker(w, 0, opts), prefix, tokens); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}
