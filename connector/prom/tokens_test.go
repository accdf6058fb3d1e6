package prom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector/prom"
)

// TestPromptTokens checks the counts by source, every source exported
// from the start.
func TestPromptTokens(t *testing.T) {
	p := prom.NewPromptTokens(prom.Options{Labels: prometheus.Labels{"model": "m"}})
	p.Add(prom.LocalCacheHit, 64)
	p.Add(prom.ExternalTransfer, 128)
	p.Add(prom.ExternalTransfer, 32)
	const want = `
# HELP kvconnect_prompt_tokens_total Prompt tokens by where their KV came from: local_compute, local_cache_hit, external_kv_transfer.
# TYPE kvconnect_prompt_tokens_total counter
kvconnect_prompt_tokens_total{model="m",source="external_kv_transfer"} 160
kvconnect_prompt_tokens_total{model="m",source="local_cache_hit"} 64
kvconnect_prompt_tokens_total{model="m",source="local_compute"} 0
`
	if err := testutil.CollectAndCompare(p, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if allocs := testing.AllocsPerRun(100, func() { p.Add(prom.LocalCompute, 7) }); allocs != 0 {
		t.Errorf("PromptTokens.Add: %v allocs/op, want 0", allocs)
	}
}

func TestPromptTokensBadInput(t *testing.T) {
	p := prom.NewPromptTokens(prom.Options{})
	for _, tc := range []struct {
		name string
		src  prom.Source
		n    int
	}{{"NegativeTokens", prom.LocalCompute, -1}, {"UnknownSource", prom.Source(3), 1}, {"NegativeSource", prom.Source(-1), 1}} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Add(%v, %d) did not panic", tc.src, tc.n)
				}
			}()
			p.Add(tc.src, tc.n)
		})
	}
}

func TestSourceString(t *testing.T) {
	for src, want := range map[prom.Source]string{
		prom.LocalCompute: "local_compute", prom.LocalCacheHit: "local_cache_hit",
		prom.ExternalTransfer: "external_kv_transfer", prom.Source(7): "Source(7)",
	} {
		if got := src.String(); got != want {
			t.Errorf("Source(%d).String() = %q, want %q", int(src), got, want)
		}
	}
}
