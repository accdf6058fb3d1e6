package prom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Source is where the KV of prompt tokens came from, vLLM's
// prompt_tokens_by_source: the value of the source label of
// kvconnect_prompt_tokens_total.
type Source int

const (
	LocalCompute     Source = iota // computed by the engine: source="local_compute"
	LocalCacheHit                  // found in the engine's local prefix cache: source="local_cache_hit"
	ExternalTransfer               // loaded through the connector: source="external_kv_transfer"
	numSources
)

var sourceNames = [numSources]string{"local_compute", "local_cache_hit", "external_kv_transfer"}

// String returns the label value of src.
func (src Source) String() string {
	if src < 0 || src >= numSources {
		return fmt.Sprintf("Source(%d)", int(src))
	}
	return sourceNames[src]
}

// PromptTokens counts an engine's prompt tokens by where their KV came
// from, as kvconnect_prompt_tokens_total{source}. The engine calls
// [PromptTokens.Add] as it learns the split: when it admits a request
// (again when it resumes one), and once a load finished or failed (a
// failed load's tokens are computed after all). Neither the connector's
// nor package scheduler's Stats say how many prompt tokens were computed:
// scheduler.Stats.ComputedTokens also counts decode steps and
// recomputation. An engine on package scheduler may add the growth of
// scheduler.Stats.LocalTokens (LocalCacheHit) and ExternalTokens
// (ExternalTransfer) since it last read them, and counts LocalCompute
// itself.
//
// A PromptTokens is a [prometheus.Collector], safe for concurrent use;
// Add allocates nothing.
type PromptTokens struct {
	c [numSources]prometheus.Counter
}

var _ prometheus.Collector = (*PromptTokens)(nil)

// NewPromptTokens returns a counter of prompt tokens whose metric carries
// the labels of opts; every source is exported from the start, at zero.
// It panics if opts.Labels names a label the package sets (see
// [Options]).
func NewPromptTokens(opts Options) *PromptTokens {
	p := &PromptTokens{}
	for src := range numSources {
		p.c[src] = prometheus.NewCounter(prometheus.CounterOpts{
			Namespace:   namespace,
			Name:        "prompt_tokens_total",
			Help:        "Prompt tokens by where their KV came from: local_compute, local_cache_hit, external_kv_transfer.",
			ConstLabels: opts.labels(prometheus.Labels{"source": src.String()}),
		})
	}
	return p
}

// Add counts n prompt tokens of source src. It panics if src is not one
// of the package's sources or n is negative: programming errors.
func (p *PromptTokens) Add(src Source, n int) {
	if src < 0 || src >= numSources || n < 0 {
		panic(fmt.Sprintf("prom: PromptTokens.Add(%v, %d): want a Source of the package and n >= 0", src, n))
	}
	p.c[src].Add(float64(n))
}

// Describe implements [prometheus.Collector].
func (p *PromptTokens) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range p.c {
		ch <- c.Desc()
	}
}

// Collect implements [prometheus.Collector].
func (p *PromptTokens) Collect(ch chan<- prometheus.Metric) {
	for _, c := range p.c {
		ch <- c
	}
}
